"""Three `sluice serve` replicas behind HAProxy, under load, through a rolling restart and a crash.

The replicas listen on free loopback ports; HAProxy (Debian's) balances them with active health
checks on /v2/health/ready (every 500 ms, down after one failure), L7 retries on connection
failures and empty responses, and redispatch to another replica. `sluice bench --url` drives it
at --connections for --duration seconds. Meanwhile:
  at --rolling-at s: replica 1 gets SIGTERM (readiness fails at once, --drain-delay later the
    listener closes, in-flight work drains) and is started again once it exits: a rolling update;
  at --crash-at s: replica 2 gets SIGKILL and is started again --crash-restart-after s later.
Prints a table of requests, errors and p50/p99 latency before, during and after each event, from
the bench's per-request samples (a request that failed in flight at the SIGKILL counts as the
crash's), each restarted replica's start-up under load (exec to ready), and writes it all as JSON
(--out). Every process it starts it stops by its PID.

    .venv/bin/python tools/replicas.py --sluice build/sluice --model-repository models \\
        --model fashion_mnist --duration 30 --rolling-at 8 --crash-at 18

Exit code 1 when requests failed during the rolling update (or, with --require-no-errors, at all).
"""
import argparse
import csv
import glob
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import yaml

HAPROXY_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "deploy",
                              "haproxy", "haproxy.cfg")


def start_all(replicas):
    """Starts every replica, then waits until each is ready."""
    for r in replicas:
        r.start()
    for r in replicas:
        if not wait_ready(r.port):
            sys.exit(f"replica {r.index} did not become ready: {open(r.log.name).read()}")


def start_haproxy(args, workdir, replicas, retry_503=True):
    """HAProxy running deploy/haproxy/haproxy.cfg as shipped (its backend given one `server` line
    a replica), or with 503 taken out of its retry-on list: its port and process."""
    port = free_port()
    with open(HAPROXY_CONFIG) as f:
        config = f.read()
    if not retry_503:
        config, found = re.subn(r"^(\s*retry-on .*) 503$", r"\1", config, flags=re.M)
        assert found == 1, "deploy/haproxy/haproxy.cfg's retry-on line names no 503"
    config += "".join(f"    server r{r.index} 127.0.0.1:{r.port}\n" for r in replicas)
    path = os.path.join(workdir, "haproxy.cfg")
    with open(path, "w") as f:
        f.write(config)
    env = dict(os.environ, SLUICE_HAPROXY_BIND=f"127.0.0.1:{port}",
               SLUICE_HAPROXY_STATS=os.path.join(workdir, "haproxy.sock"))
    haproxy = subprocess.Popen([args.haproxy, "-db", "-f", path], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=env)
    if not wait_ready(port, timeout=10):
        haproxy.kill()
        sys.exit(f"HAProxy did not start: {haproxy.communicate()[1]}")
    return port, haproxy


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False


class Replica:
    def __init__(self, args, index, repository=None):
        self.args = args
        self.index = index
        self.repository = repository or args.model_repository
        self.port = free_port()
        self.process = None
        self.log = open(os.path.join(args.workdir, f"replica{index}.log"), "a")

    def start(self):
        a = self.args
        self.process = subprocess.Popen(
            [a.sluice, "serve", "--model-repository", self.repository, "--model", a.model,
             "--port", str(self.port), "--drain-delay", str(a.drain_delay),
             "--shutdown-grace", "20"],
            stdout=self.log, stderr=subprocess.STDOUT)

    def signal(self, sig):
        if self.process and self.process.poll() is None:
            self.process.send_signal(sig)

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def haproxy_stats(path):
    """Per replica: requests sent to it, HAProxy's retries and redispatches away from it."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    rows = list(csv.DictReader(data.decode().lstrip("# ").splitlines()))
    return {r["svname"]: {"requests": int(r["stot"] or 0), "retries": int(r["wretr"] or 0),
                          "redispatches": int(r["wredis"] or 0),
                          "connection_errors": int(r["econ"] or 0),
                          "response_errors": int(r["eresp"] or 0)}
            for r in rows if r["pxname"] == "replicas"}


def phases_table(samples, events, duration):
    """Requests, errors, p50 and p99 (ms) per phase; `events` maps names to seconds on the
    bench's timeline."""
    bounds = [("before", 0.0, events["sigterm"])]
    bounds.append(("rolling update (SIGTERM -> back ready)", events["sigterm"],
                   events["rolling_ready"]))
    bounds.append(("after the rolling update", events["rolling_ready"], events["sigkill"]))
    bounds.append(("crash (SIGKILL -> back ready)", events["sigkill"], events["crash_ready"]))
    bounds.append(("after the crash", events["crash_ready"], duration + 1))
    crash = events["sigkill"]

    def phase_start(s):
        # A request that failed while in flight at the SIGKILL is the crash's, whenever it began.
        if s["outcome"] != "ok" and s["request_time_s"] < crash <= s["request_time_s"] + s[
                "latency_s"]:
            return crash
        return s["request_time_s"]

    rows = []
    for name, start, end in bounds:
        inside = [s for s in samples if start <= phase_start(s) < end]
        latencies = sorted(s["latency_s"] * 1e3 for s in inside if s["outcome"] == "ok")
        errors = [s["outcome"] for s in inside if s["outcome"] != "ok"]

        def pct(p):
            if not latencies:
                return float("nan")
            return latencies[min(len(latencies) - 1, int(p / 100 * len(latencies)))]

        rows.append({"phase": name, "from_s": round(start, 2), "to_s": round(end, 2),
                     "requests": len(inside), "errors": len(errors),
                     "error_kinds": sorted(set(errors)),
                     "p50_ms": round(pct(50), 2), "p99_ms": round(pct(99), 2),
                     "median_of_latencies_ms": round(statistics.median(latencies), 2)
                     if latencies else None})
    return rows


def changed_repository(args, workdir, name, change):
    """A repository holding a copy of the model (its files linked) whose config.yaml `change`
    edits; the repository's path."""
    source = os.path.join(args.model_repository, args.model)
    target = os.path.join(workdir, name, args.model)
    os.makedirs(target)
    for entry in os.listdir(source):
        if entry != "config.yaml":
            os.symlink(os.path.join(os.path.abspath(source), entry), os.path.join(target, entry))
    with open(os.path.join(source, "config.yaml")) as f:
        config = yaml.safe_load(f)
    change(config)
    with open(os.path.join(target, "config.yaml"), "w") as f:
        yaml.safe_dump(config, f)
    return os.path.dirname(target)


def reshaped(args, config):
    """--input-shape: the model's one input and output given that shape (for `identity`, whose
    TorchScript returns its input whatever the shape: requests the size of a real model's)."""
    if args.input_shape:
        shape = [int(d) for d in args.input_shape.split(",")]
        config["inputs"][0]["shape"] = shape
        config["outputs"][0]["shape"] = shape


def refusing_repository(args, workdir):
    """A copy of the model that refuses most of what it is sent: one request queued at most,
    each held 200 ms for company."""
    def change(config):
        reshaped(args, config)
        config["dynamic_batching"] = {"policy": "fixed", "max_queue_delay_us": 200000,
                                      "max_queue_size": 1}
        config["instances"] = {"count": 1, "threads": 1}
    return changed_repository(args, workdir, "refusing", change)


def serving_repository(args, workdir):
    """The repository the healthy replicas serve: the model as it is, or reshaped, or with other
    warm-up batch sizes."""
    if not args.input_shape and not args.warmup_batch_sizes:
        return args.model_repository

    def change(config):
        reshaped(args, config)
        if args.warmup_batch_sizes:
            config.setdefault("warmup", {})["batch_sizes"] = [
                int(b) for b in args.warmup_batch_sizes.split(",")]
    return changed_repository(args, workdir, "serving", change)


def bench_through(args, port, results, duration):
    """`sluice bench` through HAProxy: the outcomes of its measured requests (ok, or the error)."""
    run = subprocess.run(
        [args.sluice, "bench", "--url", f"http://127.0.0.1:{port}", "--model", args.model,
         "--concurrency", str(args.connections), "--duration", str(duration), "--warmup", "0.5",
         "--binary", "--results-dir", results],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=duration + 120)
    if run.returncode != 0:
        sys.exit(f"the bench failed ({run.returncode}): {run.stdout[-2000:]}")
    files = glob.glob(os.path.join(results, "*", f"samples_c{args.connections}.csv"))
    with open(files[0]) as f:
        return [r["outcome"] for r in csv.DictReader(f) if r["warmup"] != "1"]


def retry_503_check(args):
    """Replica r0 overloaded (it refuses most requests with 503) beside healthy ones: through
    HAProxy with 503 taken out of retry-on the client sees the 503s; through the shipped config,
    none, each sent again to another replica."""
    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        serving = serving_repository(args, workdir)
        replicas = [Replica(args, i, refusing_repository(args, workdir) if i == 0 else serving)
                    for i in range(args.replicas)]
        haproxy = None
        outcome = {}
        try:
            start_all(replicas)
            for retry_503 in (False, True):
                port, haproxy = start_haproxy(args, workdir, replicas, retry_503)
                outcomes = bench_through(args, port, os.path.join(workdir, f"results{retry_503}"),
                                         args.duration)
                stats = haproxy_stats(os.path.join(workdir, "haproxy.sock"))
                haproxy.terminate()
                haproxy.wait(timeout=10)
                haproxy = None
                failed = [o for o in outcomes if o != "ok"]
                outcome[retry_503] = (len(outcomes), failed, stats)
                print(f"retry-on {'with' if retry_503 else 'without'} 503: {len(outcomes)} "
                      f"requests, {len(failed)} failed ({sorted(set(failed))}); r0: "
                      f"{stats.get('r0')}")
        finally:
            if haproxy and haproxy.poll() is None:
                haproxy.terminate()
                haproxy.wait(timeout=10)
            for r in replicas:
                r.stop()
    total, failed, _ = outcome[False]
    if not failed:
        sys.exit(f"FAIL: without retry-on 503 no request failed ({total}): r0 refused nothing, "
                 "so the check shows nothing")
    total, failed, stats = outcome[True]
    redispatched = stats.get("r0", {}).get("redispatches", 0) + stats.get("r0", {}).get(
        "retries", 0)
    if failed or total == 0 or redispatched == 0:
        sys.exit(f"FAIL: with the shipped config {len(failed)} of {total} requests failed, "
                 f"{redispatched} sent again away from r0")
    print(f"retry-on 503: all {total} requests answered, {redispatched} sent again away from r0")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--model-repository", default="models")
    parser.add_argument("--model", default="fashion_mnist")
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--warmup", type=float, default=1)
    parser.add_argument("--rolling-at", type=float, default=8)
    parser.add_argument("--crash-at", type=float, default=18)
    parser.add_argument("--crash-restart-after", type=float, default=1)
    parser.add_argument("--drain-delay", type=float, default=2)
    parser.add_argument("--haproxy", default="/usr/sbin/haproxy")
    parser.add_argument("--input-shape",
                        help="serve the model with this input and output shape (e.g. 3,224,224: "
                        "requests the size of resnet18's, 602 KB in binary), through a copy of its "
                        "config; for `identity`")
    parser.add_argument("--warmup-batch-sizes",
                        help="serve the model with these warm-up batch sizes (e.g. 1,2,4,8): "
                        "what start-up under load costs with them")
    parser.add_argument("--out", help="write the table as JSON here")
    parser.add_argument("--require-no-errors", action="store_true",
                        help="fail on any failed request, the crash's included")
    parser.add_argument("--retry-503-check", action="store_true",
                        help="instead: replica r0 overloaded (503s) beside healthy ones, without "
                        "and with retry-on 503; fail unless the shipped config hides every 503")
    args = parser.parse_args()
    if args.retry_503_check:
        return retry_503_check(args)

    with tempfile.TemporaryDirectory() as workdir:
        args.workdir = workdir
        serving = serving_repository(args, workdir)
        replicas = [Replica(args, i, serving) for i in range(args.replicas)]
        haproxy = bench = None
        try:
            start_all(replicas)
            port, haproxy = start_haproxy(args, workdir, replicas)
            results = os.path.join(workdir, "results")
            bench_started = time.monotonic()
            bench = subprocess.Popen(
                [args.sluice, "bench", "--url", f"http://127.0.0.1:{port}", "--model", args.model,
                 "--concurrency", str(args.connections), "--duration", str(args.duration),
                 "--warmup", str(args.warmup), "--binary", "--results-dir", results],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            # The bench's timeline starts at its first measured request, about when its warm-up
            # ends; events are placed on it.
            origin = bench_started + args.warmup
            events = {}

            def at(offset):
                time.sleep(max(0.0, origin + offset - time.monotonic()))
                return time.monotonic() - origin

            # Rolling update of replica 1: SIGTERM, wait for its exit, start it again.
            rolling = replicas[1 % len(replicas)]
            events["sigterm"] = at(args.rolling_at)
            rolling.signal(signal.SIGTERM)
            code = rolling.process.wait(timeout=60)
            events["rolling_exit"] = time.monotonic() - origin
            events["rolling_exit_code"] = code
            events["rolling_started"] = time.monotonic() - origin
            rolling.start()
            wait_ready(rolling.port)
            events["rolling_ready"] = time.monotonic() - origin
            # Crash of replica 2: SIGKILL, a pause, start it again.
            crashed = replicas[2 % len(replicas)]
            events["sigkill"] = at(args.crash_at)
            crashed.signal(signal.SIGKILL)
            crashed.process.wait()
            time.sleep(args.crash_restart_after)
            events["crash_started"] = time.monotonic() - origin
            crashed.start()
            wait_ready(crashed.port)
            events["crash_ready"] = time.monotonic() - origin
            output, _ = bench.communicate(timeout=args.duration + 120)
            balancer = haproxy_stats(os.path.join(workdir, "haproxy.sock"))
            print(output)
            if bench.returncode != 0:
                sys.exit(f"the bench failed ({bench.returncode})")
            files = glob.glob(os.path.join(results, "*", f"samples_c{args.connections}.csv"))
            with open(files[0]) as f:
                samples = [{"request_time_s": float(r["request_time_s"]),
                            "latency_s": float(r["latency_s"]), "outcome": r["outcome"]}
                           for r in csv.DictReader(f) if r["warmup"] != "1"]
            with open(glob.glob(os.path.join(results, "*", "summary.json"))[0]) as f:
                summary = json.load(f)
        finally:
            if bench and bench.poll() is None:
                bench.kill()
                bench.wait()
            if haproxy and haproxy.poll() is None:
                haproxy.terminate()
                haproxy.wait(timeout=10)
            for r in replicas:
                r.stop()

    rows = phases_table(samples, events, args.duration)
    level = summary["levels"][0] if "levels" in summary else summary
    print(f"{args.replicas} replicas of {args.model} behind HAProxy, {args.connections} "
          f"connections, {args.duration:g} s; replica 1 SIGTERM at {events['sigterm']:.1f} s "
          f"(exit {events['rolling_exit_code']} at {events['rolling_exit']:.1f} s, ready again at "
          f"{events['rolling_ready']:.1f} s); replica 2 SIGKILL at {events['sigkill']:.1f} s "
          f"(ready again at {events['crash_ready']:.1f} s)")
    startup = {"rolling": events["rolling_ready"] - events["rolling_started"],
               "crash": events["crash_ready"] - events["crash_started"]}
    events["startup_s"] = startup
    print(f"start-up under load (exec to ready): {startup['rolling']:.2f} s after the rolling "
          f"update, {startup['crash']:.2f} s after the crash")
    print(f"| phase | from s | to s | requests | errors | p50 ms | p99 ms |")
    print(f"|---|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['phase']} | {row['from_s']:.1f} | {row['to_s']:.1f} | {row['requests']} | "
              f"{row['errors']} | {row['p50_ms']:.2f} | {row['p99_ms']:.2f} |")
    print("| replica | requests sent | retried | redispatched | connection errors | "
          "response errors |")
    print("|---|---|---|---|---|---|")
    for name, st in balancer.items():
        print(f"| {name} | {st['requests']} | {st['retries']} | {st['redispatches']} | "
              f"{st['connection_errors']} | {st['response_errors']} |")
    total_errors = sum(r["errors"] for r in rows)
    transport = level.get("transport_errors", 0)
    print(f"total: {sum(r['requests'] for r in rows)} requests, {total_errors} failed, "
          f"{transport} client transport errors")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"events": events, "phases": rows, "transport_errors": transport,
                       "haproxy": balancer,
                       "args": {k: v for k, v in vars(args).items() if k != "workdir"}}, f,
                      indent=2)
    idle = [name for name in (f"r{i}" for i in range(args.replicas))
            if balancer.get(name, {}).get("requests", 0) == 0]
    if idle:
        sys.exit(f"FAIL: replicas {idle} were sent no requests: the run tested nothing of them")
    rolling_errors = rows[1]["errors"] + rows[0]["errors"] + rows[2]["errors"]
    if rolling_errors or transport or events["rolling_exit_code"] != 0:
        sys.exit(f"FAIL: {rolling_errors} failed requests around the rolling update, "
                 f"{transport} transport errors, replica exit code {events['rolling_exit_code']}")
    if args.require_no_errors and total_errors:
        sys.exit(f"FAIL: {total_errors} failed requests")


if __name__ == "__main__":
    main()
