#!/usr/bin/env python3
"""Request traces of the real binary: `sluice serve --trace` and `sluice bench --trace` write valid
Chrome/Perfetto trace-event JSON whose spans nest; a request's stages add up to its latency as the
benchmark measured it; a traceparent header is honoured and echoed.

Usage: tests/trace_test.py SLUICE TEST_MODELS
"""
import csv
import glob
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

from sluice_server import serving

IDENTITY = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                   "data": list(range(16))}]})
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def load_trace(path):
    """The trace's complete ("X") events, after checking the file is trace-event JSON."""
    with open(path) as f:
        doc = json.load(f)
    check(isinstance(doc.get("traceEvents"), list), f"{path}: no traceEvents array")
    events = doc["traceEvents"]
    for e in events:
        check(e.get("ph") in ("X", "M"), f"unexpected phase in {e}")
        check(isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), f"no pid/tid: {e}")
        if e["ph"] == "X":
            check(e["dur"] >= 0 and e["ts"] >= 0, f"negative time in {e}")
    names = {e["tid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:
        check(e["tid"] in names, f"lane {e['tid']} is not named")
    return spans


def requests_of(spans):
    """[(root, [stages])]: each request's stages, checked to nest in it and to tile it."""
    lanes = {}
    for e in spans:
        if e["cat"] in ("request", "stage"):
            lanes.setdefault(e["tid"], []).append(e)
    out = []
    for lane, events in lanes.items():
        events.sort(key=lambda e: (e["ts"], e["cat"] != "request"))
        root = None
        end = -1.0
        for e in events:
            if e["cat"] == "request":
                check(e["ts"] >= end - 0.002, f"requests overlap on lane {lane}: {e}")
                root, end = e, e["ts"] + e["dur"]
                out.append((root, []))
                continue
            check(root is not None and e["ts"] >= root["ts"] - 0.002 and
                  e["ts"] + e["dur"] <= end + 0.002, f"stage outside its request: {e} in {root}")
            out[-1][1].append(e)
    for root, stages in out:
        check(stages, f"a request without stages: {root}")
        at = root["ts"]
        for s in stages:
            check(abs(s["ts"] - at) < 0.01, f"stages of {root} do not follow each other: {stages}")
            at = s["ts"] + s["dur"]
        total = sum(s["dur"] for s in stages)
        check(abs(total - root["dur"]) <= 0.01 + 1e-6 * root["dur"],
              f"stages add up to {total} us, the request took {root['dur']} us")
    return out


def samples_latencies_us(results_dir, name):
    files = sorted(glob.glob(os.path.join(results_dir, "*", name)))
    check(files, f"no {name} under {results_dir}")
    with open(files[-1]) as f:
        return sorted(float(r["latency_s"]) * 1e6 for r in csv.DictReader(f))


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    check(result.returncode == 0, f"{cmd} failed: {result.stdout}\n{result.stderr}")
    return result.stdout


def test_serve_and_bench_over_http(sluice, models, tmp):
    server_trace = os.path.join(tmp, "serve.json")
    client_trace = os.path.join(tmp, "bench.json")
    results = os.path.join(tmp, "results")
    with serving(sluice, ["--model-repository", models, "-m", "busy", "-m", "identity",
                          "--trace", server_trace]) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        # A sampled traceparent: honoured (its trace id in the trace) and echoed with our span.
        conn.request("POST", "/v2/models/identity/infer", IDENTITY,
                     {"traceparent": TRACEPARENT})
        answer = conn.getresponse()
        answer.read()
        check(answer.status == 200, f"infer: {answer.status}")
        echoed = answer.getheader("traceparent")
        match = re.fullmatch(r"00-4bf92f3577b34da6a3ce929d0e0e4736-([0-9a-f]{16})-01", echoed or "")
        check(match and match.group(1) != "00f067aa0ba902b7", f"traceparent echoed as {echoed}")
        server_span = match.group(1)
        # A malformed one is ignored (no echo), and the request is still answered.
        conn.request("POST", "/v2/models/identity/infer", IDENTITY, {"traceparent": "00-zz-01"})
        answer = conn.getresponse()
        answer.read()
        check(answer.status == 200 and answer.getheader("traceparent") is None,
              "a malformed traceparent is ignored")
        conn.request("POST", "/v2/models/identity/infer", "{", {})
        answer = conn.getresponse()
        answer.read()
        check(answer.status == 400, "bad JSON is a 400")
        conn.request("GET", "/v2/health/ready")
        conn.getresponse().read()
        conn.close()
        # The benchmark traces its side of every request it measures and sends a traceparent.
        run([sluice, "bench", "--url", f"http://127.0.0.1:{port}", "-m", "busy",
             "--concurrency", "1,2", "--duration", "2", "--warmup", "0.5", "--trace", client_trace,
             "--results-dir", results])

    server = requests_of(load_trace(server_trace))
    client = requests_of(load_trace(client_trace))
    by_parent = {root["args"].get("parent_span_id"): (root, stages) for root, stages in server}

    root, stages = next((r, s) for r, s in server if r["args"].get("span_id") == server_span)
    check(root["args"]["trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736" and
          root["args"]["parent_span_id"] == "00f067aa0ba902b7", f"traceparent not kept: {root}")
    check([s["name"] for s in stages] ==
          ["read", "decode", "queue", "batch", "compute", "respond", "encode", "write"],
          f"stages of an inference: {[s['name'] for s in stages]}")
    check(root["args"]["model"] == "identity" and root["args"]["batch_size"] >= 1,
          f"the batch it joined: {root['args']}")
    statuses = sorted(r["args"]["status"] for r, _ in server if r["name"].startswith("POST"))
    check(statuses.count(400) == 1, f"the 400 is traced: {statuses}")
    health = [s for r, s in server if r["name"] == "GET /v2/health/ready"]
    check(health and [s["name"] for s in health[0]] == ["read", "handle", "write"],
          f"a request no model ran: {health}")
    batches = [e for e in load_trace(server_trace) if e["cat"] == "batch"]
    check(any(b["args"]["model"] == "busy" for b in batches), "batches on instance lanes")

    # The client's root spans are exactly the latencies it recorded.
    measured = sorted(samples_latencies_us(results, "samples_c1.csv") +
                      samples_latencies_us(results, "samples_c2.csv"))
    traced = sorted(r["dur"] for r, _ in client)
    check(len(traced) == len(measured) and
          all(abs(a - b) < 0.01 for a, b in zip(traced, measured)),
          f"{len(traced)} client traces against {len(measured)} measured requests")
    # The server's stages of each request add up to the latency the client measured, within 5%
    # at the median (the rest is the loopback and the client itself).
    ratios = []
    for croot, cstages in client:
        check([s["name"] for s in cstages] == ["send", "receive"], f"client stages {cstages}")
        match = by_parent.get(croot["args"]["span_id"])
        check(match is not None, f"no server trace for client span {croot['args']}")
        sroot, sstages = match
        check(sroot["args"]["trace_id"] == croot["args"]["trace_id"], "one trace id both sides")
        # Every request's stages, each once: none missing or counted twice, whatever its timing.
        check([s["name"] for s in sstages] ==
              ["read", "decode", "queue", "batch", "compute", "respond", "encode", "write"],
              f"stages of a benchmarked request: {[s['name'] for s in sstages]}")
        ratios.append(sum(s["dur"] for s in sstages) / croot["dur"])
    within = sum(1 for r in ratios if abs(1 - r) <= 0.05) / len(ratios)
    print(f"serve vs bench: {len(ratios)} requests, median server/client "
          f"{statistics.median(ratios):.3f}, {within:.1%} within 5%")
    check(abs(1 - statistics.median(ratios)) <= 0.05, f"median ratio {statistics.median(ratios)}")
    # Single requests stray when a thread is descheduled between the socket and its stamp: 97-99%
    # within 5% on a quiet machine, but 57% within 5% beside server_overload on a 2-core Zen 5,
    # and 77% within 5% / 85% within 20% under ASan beside a compile on a 2-core Xeon. How many
    # stray is the machine's load, not Sluice's: each request's stages are checked exactly and
    # the median above moves with a stage missing or counted twice; this bound only says that
    # most requests' stages account for their latency.
    within_20 = sum(1 for r in ratios if abs(1 - r) <= 0.2) / len(ratios)
    check(within_20 >= 0.5, f"only {within:.1%} of requests within 5%, {within_20:.1%} within 20%")


def test_in_process_bench(sluice, models, tmp):
    trace = os.path.join(tmp, "inprocess.json")
    results = os.path.join(tmp, "results-inprocess")
    out = run([sluice, "bench", "--in-process", "--model-repository", models, "-m", "identity",
               "--concurrency", "8", "--iters", "400", "--trace", trace, "--results-dir", results])
    check("Trace:" in out, out)
    requests = requests_of(load_trace(trace))
    measured = samples_latencies_us(results, "samples.csv")
    traced = sorted(r["dur"] for r, _ in requests)
    check(len(traced) == len(measured) and
          all(abs(a - b) < 0.01 for a, b in zip(traced, measured)),
          "in-process traces are the measured latencies")
    names = [s["name"] for s in requests[-1][1]]
    check(names == ["submit", "queue", "batch", "compute", "complete"], f"stages {names}")
    # A quarter of the requests, sampled.
    sampled = os.path.join(tmp, "sampled.json")
    run([sluice, "bench", "--in-process", "--model-repository", models, "-m", "identity",
         "--concurrency", "8", "--iters", "399", "--trace", sampled, "--trace-sample-rate", "0.25",
         "--no-results"])
    check(len(requests_of(load_trace(sampled))) == 100, "a quarter of 400 requests traced")


def main():
    sluice, models = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        test_serve_and_bench_over_http(sluice, models, tmp)
        test_in_process_bench(sluice, models, tmp)
    print("trace: all checks passed")


if __name__ == "__main__":
    main()
