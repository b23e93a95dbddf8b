#!/usr/bin/env python3
"""One stream's decoding at real sizes: Sluice against llama.cpp on each GGUF file, and both
against the machine's memory-bandwidth roofline.

For each model directory given (benchmarks/real_size_models.py writes them): starts `sluice serve`
on 127.0.0.1 (time to ready, RSS once ready and after the runs), measures its TPOT with
`sluice bench --llm` at 1 stream (streamed /v1/completions, ignore_eos, fixed prompt and output
lengths), and llama.cpp's with `llama-bench -n OUTPUT -p 0` on the same file and thread count, in
interleaved rounds (llama.cpp, Sluice, Sluice, llama.cpp, ...). The roofline: the bytes one
token reads (every weight matrix, a mixture of experts' experts in the share a token uses; the
embedding only where the output head is tied to it, else one row; the KV cache at the mean depth
of the output, bf16) times tokens/s, over the machine's bandwidth, measured in every round beside
the runs (the machine's speed drifts, its bandwidth from 31 to 62 GB/s within minutes on a 2-core
cloud EPYC): the best of build/llm_kernels_benchmark's STREAM triad and read-only sum (over 1 GiB)
on all threads, in 1e9 bytes/s, the median of the rounds' (--bandwidth-gbs gives a fixed figure
instead). Prints the medians per file and writes them as CSV; every process started is stopped
by its PID.

Usage: benchmarks/llm_real_sizes.py models/real-sizes/llama-3.2-1b_q4_k_m ...
           [--rounds 2] [--prompt-tokens 128] [--output-tokens 64] [--out results/...csv]
"""
import argparse
import csv
import glob
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from gguf import GGUFReader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import free_port, rss_mib, wait_ready  # noqa: E402


def token_bytes(path, depth):
    """Bytes one decoded token reads from `path`'s weights, and its KV cache's at `depth`."""
    reader = GGUFReader(path)
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()

    def number(key):
        return int(reader.fields[f"{arch}.{key}"].parts[-1][0])

    # A mixture of experts reads expert_used_count of each layer's expert_count experts a token
    # (their tensors are the same size: the share of the stacked tensor).
    experts = number("expert_count") if f"{arch}.expert_count" in reader.fields else 0
    used = number("expert_used_count") if experts else 0
    weights = sum(n * used // experts if experts and name.endswith("_exps.weight") else n
                  for name, n in tensors.items() if name != "token_embd.weight")
    embedding = tensors["token_embd.weight"]
    vocab_rows = len(reader.fields["tokenizer.ggml.tokens"].data)
    weights += embedding if "output.weight" not in tensors else embedding // vocab_rows
    heads = number("attention.head_count")
    head_dim = number("embedding_length") // heads
    if f"{arch}.attention.key_length" in reader.fields:
        head_dim = number("attention.key_length")
    kv = number("block_count") * 2 * number("attention.head_count_kv") * head_dim * 2 * depth
    return weights, kv


def sluice_tpot(args, port, results_dir):
    subprocess.run([args.sluice, "bench", "--llm", "--url", f"http://127.0.0.1:{port}",
                    "--model", "m", "-c", "1", "--requests", str(args.requests),
                    "--prompt-tokens", str(args.prompt_tokens), "--output-tokens",
                    str(args.output_tokens), "--results-dir", results_dir],
                   check=True, stdout=subprocess.DEVNULL)
    runs = sorted(glob.glob(os.path.join(results_dir, "*", "summary.csv")), key=os.path.getmtime)
    with open(runs[-1]) as f:
        return float(next(csv.DictReader(f))["tpot_median_ms"])


def llama_tpot(args, path, threads):
    out = subprocess.run([args.llama_bench, "-m", path, "-p", "0", "-n", str(args.output_tokens),
                          "-t", str(threads), "-r", "2", "-o", "csv"],
                         check=True, capture_output=True, text=True).stdout
    row = next(csv.DictReader(line for line in out.splitlines() if "," in line))
    return 1000.0 / float(row["avg_ts"])


def bandwidth_gbs(kernels_benchmark, threads):
    """The best of STREAM's triad (three arrays of 256 MiB) and the read-only sum over 1 GiB on
    `threads` threads, in 1e9 bytes/s. The sum over 256 MiB read the L3 more than memory on CPUs
    whose L3 holds most of it (260 MB on an Intel Xeon, family 6 model 207: 30.3 against 28.6)."""
    out = subprocess.run([kernels_benchmark, "--benchmark_format=csv", "--benchmark_filter="
                          f"^(Triad/threads:{threads}/MiB:256|"
                          f"ReadBandwidth/threads:{threads}/MiB:1024)/",
                          "--benchmark_repetitions=3", "--benchmark_report_aggregates_only=true"],
                         check=True, capture_output=True, text=True).stdout
    rates = [float(row["bytes_per_second"]) / 1e9
             for row in csv.DictReader(line for line in out.splitlines() if "," in line)
             if row["name"].endswith("_max") or row["name"].endswith("_median")]
    return max(rates)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", help="model directories, each holding one .gguf")
    parser.add_argument("--bandwidth-gbs", type=float,
                        help="a fixed bandwidth, GB/s (1e9 bytes), instead of measuring it")
    parser.add_argument("--kernels-benchmark", default="build/llm_kernels_benchmark")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--llama-bench", default="build/peers/llama.cpp/build/bin/llama-bench")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--out", default="results/llm-real-sizes.csv")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("stopped"))
    threads = os.cpu_count() or 1
    results_dir = tempfile.mkdtemp(prefix="sluice-real-sizes-")
    rows = []
    for directory in args.dirs:
        path = glob.glob(os.path.join(directory, "*.gguf"))[0]
        name = os.path.basename(os.path.normpath(directory))
        port = free_port()
        log = open(os.path.join(results_dir, f"{name}.log"), "w")
        start = time.time()
        server = subprocess.Popen([args.sluice, "serve", "--port", str(port), "--model-dir",
                                   os.path.abspath(directory), "--model-name", "m",
                                   "--llm-prefix-caching", "off"],
                                  stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_ready(f"http://127.0.0.1:{port}/v2/health/ready", server, timeout=600)
            ready_s = time.time() - start
            rss_ready = rss_mib(server.pid)
            ours, theirs, bandwidths = [], [], []
            for r in range(args.rounds):
                if args.bandwidth_gbs is None:
                    bandwidths.append(bandwidth_gbs(args.kernels_benchmark, threads))
                for who in (("llama", "sluice") if r % 2 == 0 else ("sluice", "llama")):
                    print(f"{name} round {r + 1}/{args.rounds}: {who}", flush=True)
                    if who == "sluice":
                        ours.append(sluice_tpot(args, port, results_dir))
                    else:
                        theirs.append(llama_tpot(args, path, threads))
            rss_after = rss_mib(server.pid)
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
        weights, kv = token_bytes(path, args.prompt_tokens + args.output_tokens // 2)
        tpot, llama = statistics.median(ours), statistics.median(theirs)
        per_token = weights + kv
        ceiling = args.bandwidth_gbs or statistics.median(bandwidths)
        rows.append(dict(
            model=name, file_mb=round(os.path.getsize(path) / 1e6),
            bytes_per_token_mb=round(per_token / 1e6, 1),
            sluice_tpot_ms=round(tpot, 2), llama_cpp_tpot_ms=round(llama, 2),
            ratio=round(tpot / llama, 3),
            sluice_roofline=round(per_token / (tpot / 1000) / (ceiling * 1e9), 3),
            llama_cpp_roofline=round(per_token / (llama / 1000) / (ceiling * 1e9), 3),
            bandwidth_gbs=round(ceiling, 1),
            ready_s=round(ready_s, 1), rss_ready_mib=round(rss_ready), rss_after_mib=round(rss_after),
            bandwidth_runs=" ".join(f"{v:.1f}" for v in bandwidths),
            sluice_runs=" ".join(f"{v:.1f}" for v in ours),
            llama_cpp_runs=" ".join(f"{v:.1f}" for v in theirs)))
        print(rows[-1], flush=True)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"medians of {args.rounds} interleaved rounds, 1 stream, {args.prompt_tokens} prompt / "
          f"{args.output_tokens} output tokens, {threads} threads; roofline: the bandwidth "
          f"column (GB/s)")
    print(f"{'file':22} {'MB':>6} {'MB/tok':>7} {'Sluice ms':>9} {'llama ms':>9} {'ratio':>6} "
          f"{'roof S':>7} {'roof L':>7} {'GB/s':>5} {'ready s':>7} {'RSS MiB':>8}")
    for r in rows:
        print(f"{r['model']:22} {r['file_mb']:>6} {r['bytes_per_token_mb']:>7} "
              f"{r['sluice_tpot_ms']:>9} {r['llama_cpp_tpot_ms']:>9} {r['ratio']:>6} "
              f"{r['sluice_roofline']:>7} {r['llama_cpp_roofline']:>7} {r['bandwidth_gbs']:>5} "
              f"{r['ready_s']:>7} "
              f"{r['rss_after_mib']:>8}")
    print(f"CSV: {args.out}; logs and runs: {results_dir}")


if __name__ == "__main__":
    main()
