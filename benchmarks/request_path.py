#!/usr/bin/env python3
"""The request path at moderate load, with wrk: fashion_mnist over /predict at 1, 8 and 64
connections (requests/s, p50, p99, and how busy the machine was: /proc/stat over the run), and
the 16-float identity model over KServe v2 JSON at 64 connections against nginx answering the same
response body with `return 200` (nginx-light from Debian, 2 workers), same wrk, same run.

Each server under test (`--sluice`, and `--baseline-sluice` when given: the build before) runs on
127.0.0.1 with its default config; the levels take turns across the servers, the order flipping
each round (A B, B A, ...), so drift falls on all alike. Also runs `sluice bench --in-process`
(batch 1) for the in-process p50 the 1-connection p50 is held against. Every process started is
stopped by its PID.

With --stages, instead: where a request's time goes, from the server's own trace (`sluice serve
--trace`, a fifth of the requests sampled): the mean of each stage (read, decode, queue, batch,
compute, respond, encode, write) at 1, 8 and 64 connections, and the rest of wrk's round trip
(the client, the kernel, and the hand-offs the stages do not cover), and the thread hand-offs per
request from the server's counters (/metrics), each level on a fresh server.

Usage: benchmarks/request_path.py [--sluice build/sluice] [--baseline-sluice PATH]
           [--models models] [--test-models build/test-models] [--seconds 5] [--rounds 2]
           [--stages]
"""
import argparse
import base64
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import free_port, wait_ready  # noqa: E402


def cpu_times():
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields), idle


def wrk(url, script, connections, seconds):
    """requests/s, p50 ms, p99 ms, machine busy % over the run."""
    before = cpu_times()
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "-s",
                          script, url], capture_output=True, text=True, check=True).stdout
    after = cpu_times()
    total, idle = after[0] - before[0], after[1] - before[1]

    def millis(label):
        m = re.search(rf"^\s+{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        value = float(m.group(1))
        return value / 1000 if m.group(2) == "us" else value * 1000 if m.group(2) == "s" else value

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        sys.exit(f"wrk saw {errors.group(1)} error responses from {url}")
    rps = float(re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M).group(1))
    return rps, millis("50%"), millis("99%"), 100.0 * (total - idle) / max(total, 1)


def post_script(path, body, content_type):
    with open(path + ".body", "wb") as f:
        f.write(body)
    with open(path, "w") as f:
        f.write(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "{content_type}"\n'
                f'local f = io.open("{path}.body", "rb")\nwrk.body = f:read("*a")\nf:close()\n')
    return path


class Process:
    def __init__(self, command, log, ready_url=None):
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        if ready_url:
            wait_ready(ready_url, self.process)

    def stop(self, sig=signal.SIGTERM):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


STAGES = ["read", "decode", "queue", "batch", "compute", "respond", "encode", "handle", "write"]


# The server's counters of thread hand-offs (/metrics): an instance woken, an idle instance that
# saw work arrive while it spun (a hand-off without a wake-up), a decode thread woken,
# work posted to a connection's I/O thread; and answers sent from the instance's thread (a batch
# of one) before that hand-off.
HAND_OFFS = {"instance wake-ups": "sluice_instance_wakeups_total",
             "spin catches": "sluice_instance_spin_catches_total",
             "decode wake-ups": "sluice_decode_pool_wakeups_total",
             "I/O hand-offs": "sluice_http_handoffs_total",
             "answers in place": "sluice_http_answers_in_place_total"}


def hand_offs(port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()

    def total(name, label=""):
        return sum(float(m.group(1)) for m in re.finditer(
            rf"^{name}(?:{{[^}}]*{label}[^}}]*}})? ([\d.e+]+)$", text, re.M))
    counts = {key: total(name) for key, name in HAND_OFFS.items()}
    counts["requests"] = total("sluice_requests_total", 'outcome="ok"')
    return counts


def stages(args, servers, repository, predict_lua, work, log):
    """Per server and connection level: the mean of each traced stage, in ms."""
    print("| server | connections | requests/s | round trip | " + " | ".join(STAGES) +
          " | untraced | " + " | ".join(f"{key} / request" for key in HAND_OFFS) + " |")
    print("|---" * (len(STAGES) + 5 + len(HAND_OFFS)) + "|")
    for connections in (1, 8, 64):
        for name, binary in servers.items():
            trace = os.path.join(work, f"{name}-{connections}.json")
            port = free_port()
            server = Process([binary, "serve", "--model-repository", repository, "--port",
                              str(port), "--trace", trace, "--trace-sample-rate", "0.2"], log,
                             f"http://127.0.0.1:{port}/v2/health/ready")
            try:
                before = hand_offs(port)
                rps, _, _, _ = wrk(f"http://127.0.0.1:{port}/predict", predict_lua, connections,
                                   args.seconds)
                after = hand_offs(port)
            finally:
                server.stop()
            answered = max(after["requests"] - before["requests"], 1)
            per_request = {key: (after[key] - before[key]) / answered for key in HAND_OFFS}
            with open(trace) as f:
                events = json.load(f)
            events = events["traceEvents"] if isinstance(events, dict) else events
            sums, requests = {}, 0
            for event in events:
                if event.get("cat") == "request" and event["name"] == "POST /predict":
                    requests += 1
                elif event.get("cat") == "stage":
                    sums[event["name"]] = sums.get(event["name"], 0.0) + event["dur"]
            means = {stage: sums.get(stage, 0.0) / max(requests, 1) / 1000 for stage in STAGES}
            round_trip = connections / rps * 1000
            print(f"| {name} | {connections} | {rps:,.0f} | {round_trip:.3f} | " +
                  " | ".join(f"{means[stage]:.3f}" for stage in STAGES) +
                  f" | {round_trip - sum(means.values()):.3f} | " +
                  " | ".join(f"{per_request[key]:.2f}" for key in HAND_OFFS) + " |")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--baseline-sluice")
    parser.add_argument("--models", default="models")
    parser.add_argument("--test-models", default="build/test-models")
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--stages", action="store_true",
                        help="where a request's time goes, from the server's trace")
    args = parser.parse_args()
    for tool in ("wrk", "nginx"):
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}"):
            sys.exit(f"{tool} is not installed (scripts/install-deps.sh)")
    work = tempfile.mkdtemp()
    log = open(os.path.join(work, "servers.log"), "w")
    processes = []
    try:
        repository = os.path.join(work, "repository")
        os.makedirs(repository)
        os.symlink(os.path.abspath(os.path.join(args.models, "fashion_mnist")),
                   os.path.join(repository, "fashion_mnist"))
        os.symlink(os.path.abspath(os.path.join(args.test_models, "identity")),
                   os.path.join(repository, "identity"))
        servers = {"sluice": args.sluice}
        if args.baseline_sluice:
            servers["baseline"] = args.baseline_sluice
        ports = {}
        for name, binary in servers.items():
            port = free_port()
            processes.append(Process([binary, "serve", "--model-repository", repository,
                                      "--port", str(port)], log,
                                     f"http://127.0.0.1:{port}/v2/health/ready"))
            ports[name] = port
        any_port = next(iter(ports.values()))

        # The payloads: one Fashion-MNIST test-set-like image as PNG (a drawn shape, 28 x 28),
        # and 16 floats for the identity model; the identity's answer is nginx's fixed body.
        from PIL import Image, ImageDraw  # noqa: E402  (the venv's Pillow, via torchvision)
        image = Image.new("L", (28, 28), 0)
        ImageDraw.Draw(image).rectangle([6, 4, 21, 24], fill=200)
        png = io.BytesIO()
        image.save(png, format="PNG")
        predict_body = json.dumps({"image": base64.b64encode(png.getvalue()).decode()}).encode()
        v2_body = json.dumps({"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32",
                                          "data": [0.25 * i for i in range(16)]}]}).encode()
        answer = urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{any_port}/v2/models/identity/infer", v2_body,
            {"Content-Type": "application/json"})).read()
        predict_lua = post_script(os.path.join(work, "predict.lua"), predict_body,
                                  "application/json")
        v2_lua = post_script(os.path.join(work, "v2.lua"), v2_body, "application/json")

        nginx_port = free_port()
        nginx_dir = os.path.join(work, "nginx")
        os.makedirs(os.path.join(nginx_dir, "logs"))
        body = answer.decode().replace("\\", "\\\\").replace("'", "\\'")
        with open(os.path.join(nginx_dir, "nginx.conf"), "w") as f:
            f.write(f"""daemon off;
worker_processes 2;
pid {nginx_dir}/nginx.pid;
error_log {nginx_dir}/logs/error.log;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {nginx_dir}/body;
  server {{
    listen 127.0.0.1:{nginx_port};
    location / {{
      default_type application/json;
      return 200 '{body}';
    }}
  }}
}}
""")
        nginx = Process(["/usr/sbin/nginx", "-p", nginx_dir, "-c",
                         os.path.join(nginx_dir, "nginx.conf")], log)
        processes.append(nginx)
        time.sleep(0.5)

        in_process = subprocess.run(
            [args.sluice, "bench", "--in-process", "--model-repository", repository, "--model",
             "fashion_mnist", "--batch-size", "1", "--iters", "2000", "--max-in-flight", "1",
             "--no-results"], capture_output=True, text=True, check=True).stdout
        p50 = re.search(r"Latency p50 / p90 / p95 / p99 / p99.9: ([\d.]+)", in_process)
        print(f"in-process fashion_mnist, batch 1, one request in flight: p50 "
              f"{float(p50.group(1)) * 1000:.3f} ms")

        if args.stages:
            return stages(args, servers, repository, predict_lua, work, log)
        results = {}
        levels = [("predict", 1), ("predict", 8), ("predict", 64), ("v2", 64)]
        for round_index in range(args.rounds):
            order = list(servers) + ["nginx"]
            if round_index % 2:
                order.reverse()
            for kind, connections in levels:
                for name in order:
                    if name == "nginx":
                        if kind != "v2":
                            continue
                        url = f"http://127.0.0.1:{nginx_port}/v2/models/identity/infer"
                    else:
                        path = "/predict" if kind == "predict" else "/v2/models/identity/infer"
                        url = f"http://127.0.0.1:{ports[name]}{path}"
                    script = predict_lua if kind == "predict" else v2_lua
                    result = wrk(url, script, connections, args.seconds)
                    results.setdefault((name, kind, connections), []).append(result)
        print(f"{args.rounds} rounds of {args.seconds} s per level; medians")
        print("| server | workload | connections | requests/s | p50 ms | p99 ms | machine busy |")
        print("|---|---|---|---|---|---|---|")
        for (name, kind, connections), runs in results.items():
            med = [statistics.median(r[i] for r in runs) for i in range(4)]
            print(f"| {name} | {'fashion_mnist /predict' if kind == 'predict' else 'identity v2 JSON'}"
                  f" | {connections} | {med[0]:,.0f} | {med[1]:.3f} | {med[2]:.3f} | {med[3]:.0f}% |")
        for name in servers:
            ours = statistics.median(r[0] for r in results[(name, "v2", 64)])
            theirs = statistics.median(r[0] for r in results[("nginx", "v2", 64)])
            eight = statistics.median(r[0] for r in results[(name, "predict", 8)])
            sixty_four = statistics.median(r[0] for r in results[(name, "predict", 64)])
            print(f"{name}: identity v2 / nginx {ours / theirs:.2f}; /predict 8 / 64 connections "
                  f"{eight / sixty_four:.2f}")
    finally:
        for p in processes:  # nginx ends its workers on SIGQUIT after their requests.
            p.stop(signal.SIGQUIT if p.process.args[0].endswith("nginx") else signal.SIGTERM)
        log.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
