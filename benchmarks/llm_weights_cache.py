#!/usr/bin/env python3
"""The weights cache (`--llm-weights-cache`) on GGUF files: start-up, decoding speed and memory.

For each model directory given:
  start-up   seconds from `sluice serve` to ready: without a cache, with an empty cache folder
             (repacking, then writing the file) and with the file there (mapping it); the three in
             turn, `--rounds` times, order rotating.
  TPOT       two servers at once, one without a cache (its repacked weights in private huge pages)
             and one mapping the cache file; `sluice bench --llm -c 1` against each in turn,
             A B B A ..., medians.
  memory     RSS and PSS (/proc/PID/smaps_rollup) of the server without a cache, of one mapping
             the file alone, then of two mapping it at once (the file's pages shared: each
             process's PSS counts half of them).

Usage: benchmarks/llm_weights_cache.py [--cache-dir DIR] [--rounds 3] MODEL_DIR...
(the cache goes in a new folder inside DIR, /var/tmp by default, on disk; a tmpfs mounted with
huge=within_size gives the mapped weights huge pages.)
"""
import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_real_sizes import sluice_tpot  # noqa: E402
from llm_side_by_side import Server, free_port  # noqa: E402


def smaps_mib(pid):
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            fields = line.split()
            if fields[0] in ("Rss:", "Pss:"):
                values[fields[0][:-1].lower()] = int(fields[1]) / 1024
    return values


def start(sluice, model_dir, cache, log):
    """A server (llm_side_by_side.Server), with the seconds it took to be ready as ready_s."""
    port = free_port()
    command = [sluice, "serve", "--port", str(port), "--model-dir", model_dir, "--model-name", "m",
               "--llm-prefix-caching", "off"]
    if cache:
        command += ["--llm-weights-cache", cache]
    began = time.time()
    server = Server("sluice", command, "/v2/health/ready", port, log)
    server.ready_s = time.time() - began
    return server


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dirs", nargs="+")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--cache-dir")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    # A folder of its own (emptied between runs) inside the one given.
    cache = os.path.join(tempfile.mkdtemp(prefix="sluice-weights-cache-",
                                          dir=args.cache_dir or "/var/tmp"), "cache")
    results_dir = tempfile.mkdtemp(prefix="sluice-weights-cache-runs-")
    log = open(os.path.join(results_dir, "servers.log"), "w")
    rows = []
    for directory in args.dirs:
        directory = os.path.abspath(directory)
        name = os.path.basename(os.path.normpath(directory))
        startup = {"none": [], "write": [], "map": []}
        kinds = list(startup)
        for r in range(args.rounds):
            for kind in kinds[r % 3:] + kinds[:r % 3]:
                if kind == "write":
                    shutil.rmtree(cache, ignore_errors=True)
                elif kind == "map" and not (os.path.isdir(cache) and os.listdir(cache)):
                    start(args.sluice, directory, cache, log).stop()  # Writes the file.
                server = start(args.sluice, directory, cache if kind != "none" else "", log)
                startup[kind].append(server.ready_s)
                server.stop()
                print(f"{name} start-up round {r + 1}: {kind} {server.ready_s:.2f} s", flush=True)

        private = start(args.sluice, directory, "", log)
        mapped = start(args.sluice, directory, cache, log)
        memory = {"private": smaps_mib(private.process.pid), "mapped": smaps_mib(mapped.process.pid)}
        tpot = {"private": [], "mapped": []}
        try:
            for r in range(args.rounds):
                for who in (("private", "mapped") if r % 2 == 0 else ("mapped", "private")):
                    server = private if who == "private" else mapped
                    tpot[who].append(sluice_tpot(args, server.port, results_dir))
                    print(f"{name} TPOT round {r + 1}: {who} {tpot[who][-1]:.2f} ms", flush=True)
            private.stop()
            second = start(args.sluice, directory, cache, log)
            memory["two mapped, each"] = smaps_mib(second.process.pid)
            second.stop()
        finally:
            for server in (private, mapped):
                server.stop()
        rows.append(dict(name=name, startup={k: statistics.median(v) for k, v in startup.items()},
                         tpot={k: statistics.median(v) for k, v in tpot.items()}, memory=memory,
                         cache_mib=sum(os.path.getsize(os.path.join(cache, f))
                                       for f in os.listdir(cache)) / 2**20))
        shutil.rmtree(cache, ignore_errors=True)

    print("\n| file | ready s: no cache / writing / mapping | TPOT ms: private / mapped | "
          "RSS (PSS) MiB: private, mapped alone, each of two mapped | cache file MiB |")
    print("|---|---|---|---|---|")
    for r in rows:
        s, t, m = r["startup"], r["tpot"], r["memory"]
        print(f"| {r['name']} | {s['none']:.2f} / {s['write']:.2f} / {s['map']:.2f} | "
              f"{t['private']:.2f} / {t['mapped']:.2f} ({t['mapped'] / t['private']:.3f} x) | "
              + ", ".join(f"{m[k]['rss']:.0f} ({m[k]['pss']:.0f})"
                          for k in ("private", "mapped", "two mapped, each"))
              + f" | {r['cache_mib']:.0f} |")
    print(f"(servers' output: {log.name})")


if __name__ == "__main__":
    main()
