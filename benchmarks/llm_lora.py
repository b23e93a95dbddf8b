#!/usr/bin/env python3
"""LoRA adapters under load: 16 streams over 4 adapters against 16 streams of the base model.

Writes ADAPTERS random PEFT-layout adapters (rank RANK on every projection of every layer:
q, k, v, o, gate, up, down) for MODEL_DIR (a model in the Hugging Face layout, or a GGUF file's
folder: the shapes then come from its metadata, and the base keeps its quantised weights), serves the base
with them (config.yaml's llm.lora), and runs `sluice bench --llm` as ADAPTERS processes of
STREAMS / ADAPTERS streams each: every process on the base model, then each process on its own
adapter, in the order base, adapters, adapters, base, ... over `--rounds`. Prints the output
tokens/s of both (the processes' sum) and their ratio, medians over the rounds.

Usage: benchmarks/llm_lora.py MODEL_DIR [--rounds 2] [--streams 16] [--adapters 4] [--rank 16]
"""
import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
from types import SimpleNamespace

import numpy
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_side_by_side import Server, bench, free_port  # noqa: E402

MODULES = {"self_attn": ["q_proj", "k_proj", "v_proj", "o_proj"],
           "mlp": ["gate_proj", "up_proj", "down_proj"]}


def write_adapter(path, config, rank, seed):
    """A PEFT-layout adapter of random weights (small, so the text stays the model's)."""
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config.get("head_dim") or hidden // heads
    shapes = {"q_proj": (heads * head_dim, hidden), "k_proj": (kv * head_dim, hidden),
              "v_proj": (kv * head_dim, hidden), "o_proj": (hidden, heads * head_dim),
              "gate_proj": (inter, hidden), "up_proj": (inter, hidden),
              "down_proj": (hidden, inter)}
    random = numpy.random.default_rng(seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for block, names in MODULES.items():
            for name in names:
                out, inp = shapes[name]
                key = f"base_model.model.model.layers.{layer}.{block}.{name}"
                tensors[f"{key}.lora_A.weight"] = (
                    random.standard_normal((rank, inp), dtype=numpy.float32) * 0.01)
                tensors[f"{key}.lora_B.weight"] = (
                    random.standard_normal((out, rank), dtype=numpy.float32) * 0.01)
    os.makedirs(path)
    save_file(tensors, os.path.join(path, "adapter_model.safetensors"))
    with open(os.path.join(path, "adapter_config.json"), "w") as f:
        json.dump({"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "bias": "none",
                   "target_modules": [n for names in MODULES.values() for n in names]}, f)


def gguf_config(model_dir):
    """config.json's shape keys from the GGUF file in `model_dir`."""
    import gguf
    path = next(os.path.join(model_dir, n) for n in sorted(os.listdir(model_dir))
                if n.endswith(".gguf"))
    reader = gguf.GGUFReader(path)

    def value(key):
        field = reader.fields[key]
        return field.contents() if hasattr(field, "contents") else field.parts[-1][0]

    arch = value("general.architecture")
    config = {"num_attention_heads": int(value(f"{arch}.attention.head_count")),
              "num_key_value_heads": int(value(f"{arch}.attention.head_count_kv")),
              "hidden_size": int(value(f"{arch}.embedding_length")),
              "intermediate_size": int(value(f"{arch}.feed_forward_length")),
              "num_hidden_layers": int(value(f"{arch}.block_count"))}
    if f"{arch}.attention.key_length" in reader.fields:
        config["head_dim"] = int(value(f"{arch}.attention.key_length"))
    return config


def run(args, port, models, results):
    """Output tokens/s of one `sluice bench --llm` process per entry of `models`, all at once."""
    options = SimpleNamespace(prompt_tokens=64, output_tokens=args.output_tokens,
                              requests=args.requests // len(models))
    found = {}

    def one(index, model):
        rows = bench(args.sluice, port, model, str(args.streams // len(models)), options,
                     os.path.join(results, f"{index}-{model}"))
        found[index] = float(rows[0]["output_tokens_per_s"])

    threads = [threading.Thread(target=one, args=(i, m)) for i, m in enumerate(models)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if len(found) != len(models):
        sys.exit("a sluice bench process failed")
    return sum(found.values())


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--adapters", type=int, default=4)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--precision", default="bf16")
    args = parser.parse_args()
    source = os.path.abspath(args.model_dir)
    if os.path.exists(os.path.join(source, "config.json")):
        with open(os.path.join(source, "config.json")) as f:
            config = json.load(f)
    else:
        config = gguf_config(source)
    work = tempfile.mkdtemp(prefix="sluice-lora-")
    try:
        model = os.path.join(work, "repository", "base")
        os.makedirs(model)
        for name in os.listdir(source):
            if name != "config.yaml":
                os.symlink(os.path.join(source, name), os.path.join(model, name))
        names = [f"adapter{i}" for i in range(args.adapters)]
        for i, name in enumerate(names):
            write_adapter(os.path.join(work, name), config, args.rank, seed=i)
        with open(os.path.join(model, "config.yaml"), "w") as f:
            f.write(f"llm:\n  precision: {args.precision}\n  slots: {args.streams}\n"
                    f"  lora:\n    max_loras: {args.adapters}\n    max_lora_rank: {args.rank}\n"
                    "    adapters:\n" +
                    "".join(f"      {n}: {os.path.join(work, n)}\n" for n in names))
        port = free_port()
        server = Server("sluice", [args.sluice, "serve", "--port", str(port), "--model-repository",
                                   os.path.join(work, "repository"), "--llm-prefix-caching",
                                   "off"], "/v2/health/ready", port, open(os.devnull, "w"))
        figures = {"base": [], "adapters": []}
        try:
            for r in range(args.rounds):
                for mode in (("base", "adapters") if r % 2 == 0 else ("adapters", "base")):
                    models = ["base"] * args.adapters if mode == "base" else names
                    rate = run(args, port, models, os.path.join(work, f"{mode}-{r}"))
                    figures[mode].append(rate)
                    print(f"round {r + 1}, {mode}: {rate:.1f} output tokens/s", flush=True)
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    base, adapters = (statistics.median(figures[m]) for m in ("base", "adapters"))
    print(f"\n| {args.streams} streams | output tokens/s |\n|---|---|")
    print(f"| base model | {base:.1f} |")
    print(f"| over {args.adapters} adapters (rank {args.rank}, all projections) | {adapters:.1f} |")
    print(f"| ratio | {adapters / base:.2f} |")


if __name__ == "__main__":
    main()
