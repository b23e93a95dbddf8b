#!/usr/bin/env python3
"""Sluice against transformers per architecture, on small random models made here.

For each architecture Sluice serves from GGUF files (llama, mistral, qwen2, qwen3, phi3, gemma3), a random
model from transformers' own class (tools/gguf_models.py's, at --hidden / --layers: by default
hidden 512, feed-forward 1536, 16 layers, 8 heads of 64, 4 KV heads, about 50 M parameters, with
the tests' 384-token tokenizer, so the output head is small; gemma3's sliding window 512 on
every other layer, longer than the runs' sequences), written as:
  hf/        the Hugging Face folder in bf16, which transformers serves (eager `generate`, a
             batch of B left-padded prompts; the LitServe seed's baseline);
  f16/       a GGUF file (F16; Sluice serves its float tensors in bf16), and
  q4_k_m/    the same quantised by llama.cpp's own quantiser (Q4_K + Q6_K), kept quantised.
At each batch size / concurrency B: output tokens/s of transformers, Sluice on the F16 file and
Sluice on the Q4_K_M file (`sluice bench --llm --in-process`, B requests at once), the same
prompt length and greedy output length, rounds in alternating order (A B C, C B A, ...); the
table has medians and Sluice's ratios to transformers.

Usage: benchmarks/llm_architectures.py [--out build/arch-models] [--batch 1,16] [--rounds 2]
"""
import argparse
import os
import shutil
import statistics
import sys

import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
sys.path.insert(0, HERE)
import gguf_models  # noqa: E402
from llm_transformers_compare import run_sluice, run_transformers  # noqa: E402


def make_models(out, arch, seed, shape, tokenizer_dir):
    """The three directories of one architecture (skipped where they exist)."""
    import json
    root = os.path.join(out, arch)
    hf_dir, f16_dir, q4_dir = (os.path.join(root, n) for n in ("hf", "f16", "q4_k_m"))
    if all(os.path.exists(d) for d in (hf_dir, f16_dir, q4_dir)):
        return hf_dir, f16_dir, q4_dir
    tokenizer_json = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
    chat_template = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))[
        "chat_template"]
    vocab = 1 + max(max(tokenizer_json["model"]["vocab"].values()),
                    max(t["id"] for t in tokenizer_json["added_tokens"]))
    model = gguf_models.hf_model(arch, vocab, seed, **shape)
    os.makedirs(root, exist_ok=True)
    f32 = os.path.join(root, "model-f32.gguf")
    gguf_models.write_gguf(f32, arch, model, tokenizer_json, chat_template)
    for kind, directory in (("f16", f16_dir), ("q4_k_m", q4_dir)):
        os.makedirs(directory, exist_ok=True)
        gguf_models.quantize(f32, os.path.join(directory, "model.gguf"), kind)
    os.remove(f32)
    model.to(torch.bfloat16).save_pretrained(hf_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(tokenizer_dir, name), hf_dir)
    return hf_dir, f16_dir, q4_dir


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--out", default="build/arch-models")
    parser.add_argument("--tokenizer", default="build/test-models/tiny_llm",
                        help="the tests' tokenizer folder (tools/llm_export.py --test)")
    parser.add_argument("--architectures", default=",".join(gguf_models.ARCHITECTURES))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--batch", default="1,16")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    args = parser.parse_args()
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    shape = dict(hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                 num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                 num_key_value_heads=max(1, args.hidden // 128), max_position_embeddings=1024,
                 sliding_window=512)
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, {args.threads} "
          f"threads, {args.prompt_tokens}-token prompts, {args.output_tokens} output tokens, "
          f"greedy; random models: {shape}", flush=True)
    rows = []
    for i, arch in enumerate(args.architectures.split(",")):
        hf_dir, f16_dir, q4_dir = make_models(args.out, arch, 301 + i, shape, args.tokenizer)
        tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.bfloat16)
        model.eval()
        model.generation_config.eos_token_id = None  # Fixed output lengths, as ignore_eos.
        variants = ["transformers", "sluice f16", "sluice q4_k_m"]
        for batch in [int(b) for b in args.batch.split(",")]:
            results = {}
            for r in range(args.rounds):
                for variant in variants if r % 2 == 0 else variants[::-1]:
                    if variant == "transformers":
                        value, _ = run_transformers(model, tokenizer, "eager", batch,
                                                    args.prompt_tokens, args.output_tokens,
                                                    args.threads)
                    else:
                        value = run_sluice(args.sluice, f16_dir if "f16" in variant else q4_dir,
                                           batch, args.prompt_tokens, args.output_tokens,
                                           args.threads, precision=None)
                    results.setdefault(variant, []).append(value)
                    print(f"{arch} batch {batch} round {r + 1}: {variant} {value:.1f} tokens/s",
                          flush=True)
            rows.append((arch, batch, {v: statistics.median(results[v]) for v in variants}))
    print("\n| architecture | streams | transformers bf16 | Sluice F16 file (bf16) | "
          "Sluice Q4_K_M file | F16 / transformers | Q4_K_M / transformers |")
    print("|---|---|---|---|---|---|---|")
    for arch, batch, m in rows:
        base = m["transformers"]
        print(f"| {arch} | {batch} | {base:.1f} | {m['sluice f16']:.1f} | "
              f"{m['sluice q4_k_m']:.1f} | {m['sluice f16'] / base:.2f} | "
              f"{m['sluice q4_k_m'] / base:.2f} |")


if __name__ == "__main__":
    sys.exit(main())
