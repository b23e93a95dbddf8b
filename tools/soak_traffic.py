#!/usr/bin/python3
"""Hostile and broken HTTP traffic for the soak test, alongside `sluice bench`'s valid load.

Each worker thread loops until the deadline over a fixed list of cases: malformed and invalid
requests (each must get its expected 4xx status, never a 5xx, never a hang) and clients that
disconnect mid-request or before their answer. Prints one line per case with its count and any
unexpected outcomes, and exits 1 if there were any.

Usage: tools/soak_traffic.py --port PORT --seconds 600 [--threads 2] [--model identity]
"""
import argparse
import collections
import json
import socket
import sys
import threading
import time

TIMEOUT = 10.0  # Seconds a case may take before it counts as a hang.


def infer_body(model_width, first=0):
    data = ",".join(str(first + i) for i in range(model_width))
    return ('{"inputs":[{"name":"input","shape":[1,%d],"datatype":"FP32","data":[%s]}]}'
            % (model_width, data)).encode()


def request(method, path, body=b"", headers=()):
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    head += list(headers)
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def read_status(sock):
    """The status code of the first response on `sock`; None if it closed first."""
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return None
        data += chunk
    return int(data.split(b" ", 2)[1])


def exchange(port, payload, close_after_send=False):
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        try:
            sock.sendall(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # Answered early (413, 431) and closed: the answer is still there to read.
        if close_after_send:
            return "closed"
        try:
            return read_status(sock)
        except ConnectionResetError:
            return None


def cases(model, width):
    good = infer_body(width)
    infer = f"/v2/models/{model}/infer"
    # Claims 9999 bytes of binary tensor data; 64 follow.
    lying_header = (b'{"inputs":[{"name":"input","shape":[1,%d],"datatype":"FP32",'
                    b'"parameters":{"binary_data_size":9999}}]}' % width)
    return {
        # name: (payload, expected status, or "closed" for a client that leaves)
        "malformed_json": (request("POST", infer, b'{"inputs":[{"name":'), 400),
        "wrong_shape": (request("POST", infer, good.replace(b"[1,%d]" % width, b"[1,3]")), 400),
        "wrong_datatype": (request("POST", infer, good.replace(b"FP32", b"BYTES")), 400),
        "nan_in_json": (request("POST", infer, good.replace(b"[0,", b"[NaN,")), 400),
        "huge_shape": (request("POST", infer, good.replace(b"[1,%d]" % width,
                                                          b"[1000000,1000000]")), 400),
        "unknown_model": (request("POST", "/v2/models/nope/infer", good), 404),
        "path_traversal": (request("GET", "/v2/models/..%2F..%2Fetc/ready"), 400),
        "wrong_method": (request("DELETE", infer), 405),
        "empty_body": (request("POST", infer), 400),
        "not_http": (b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03garbage\r\n\r\n", 400),
        "huge_header": (request("GET", "/v2", headers=["X-Filler: " + "a" * 20000]), 431),
        # The server runs with --max-body-bytes below 1 MiB.
        "oversized_body": (request("POST", infer, b" " * (1 << 20)), 413),
        "bad_chunk": (b"POST " + infer.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                      b"Transfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n", 400),
        "leave_before_answer": (request("POST", infer, good), "closed"),
        "leave_mid_header": (b"POST " + infer.encode() + b" HTTP/1.1\r\nHost: x\r\nCont",
                             "closed"),
        "leave_mid_body": (request("POST", infer, good)[:-10], "closed"),
        "binary_size_lies": (request("POST", infer, lying_header + b"\0" * 64, headers=[
            f"Inference-Header-Content-Length: {len(lying_header)}"]), 400),
        "metrics": (request("GET", "/metrics"), 200),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="identity")
    parser.add_argument("--width", type=int, default=16, help="the model's input length")
    args = parser.parse_args()

    table = cases(args.model, args.width)
    counts = collections.Counter()
    unexpected = collections.defaultdict(collections.Counter)
    lock = threading.Lock()
    deadline = time.monotonic() + args.seconds

    def worker():
        while time.monotonic() < deadline:
            for name, (payload, expected) in table.items():
                try:
                    outcome = exchange(args.port, payload, close_after_send=expected == "closed")
                except socket.timeout:
                    outcome = "hang"
                except OSError as e:
                    outcome = f"error {e.errno}"
                with lock:
                    counts[name] += 1
                    if outcome != expected:
                        unexpected[name][str(outcome)] += 1

    threads = [threading.Thread(target=worker) for _ in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    print(f"{'case':22} {'sent':>8}  unexpected")
    for name in table:
        bad = ", ".join(f"{k} x{v}" for k, v in unexpected[name].items()) or "-"
        print(f"{name:22} {counts[name]:8}  {bad}")
    total_bad = sum(sum(c.values()) for c in unexpected.values())
    print(f"hostile traffic: {sum(counts.values())} requests, {total_bad} unexpected")
    sys.exit(1 if total_bad else 0)


if __name__ == "__main__":
    main()
