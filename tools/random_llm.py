#!/usr/bin/env python3
"""Writes a Hugging Face model folder in the shape of a language model people run, with random
bf16 weights: config.json, model.safetensors and the tokenizer files of --tokenizer. PyTorch is all
it needs (the safetensors format is written here), so it runs on a GPU machine that has nothing
but PyTorch: scripts/gpu-check.sh makes its language models with it. Random weights decode noise:
measure with fixed output lengths.

  smollm2-135m   SmolLM2-135M (the LitServe benchmark's size class): hidden 576, 30 layers,
                 9 heads / 3 KV heads of 64, FFN 1536, vocab 49152, tied; 0.13 B parameters
  qwen2.5-0.5b   Qwen2.5-0.5B: hidden 896, 24 layers, 14 / 2 heads of 64, FFN 4864, q/k/v biases,
                 vocab 151936, tied; 0.49 B
  qwen2.5-1.5b   Qwen2.5-1.5B: hidden 1536, 28 layers, 12 / 2 heads of 128, FFN 8960, q/k/v
                 biases, vocab 151936, tied; 1.54 B
  llama-3.2-3b   Llama-3.2-3B: hidden 3072, 28 layers, 24 / 8 heads of 128, FFN 8192, vocab
                 128256, tied, Llama 3's RoPE scaling; 3.21 B

The tokenizer's vocabulary may be smaller than the model's (the rows past it are never a prompt's).

Usage: tools/random_llm.py --shape smollm2-135m --tokenizer DIR --out DIR [--seed 0]
"""
import argparse
import json
import os
import shutil
import struct

import torch

SHAPES = {
    "smollm2-135m": dict(model_type="llama", hidden_size=576, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, intermediate_size=1536,
                         vocab_size=49152, rope_theta=100000.0, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, tie_word_embeddings=True),
    "qwen2.5-0.5b": dict(model_type="qwen2", hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
                         vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=32768,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    "qwen2.5-1.5b": dict(model_type="qwen2", hidden_size=1536, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                         vocab_size=151936, rope_theta=1000000.0, max_position_embeddings=32768,
                         rms_norm_eps=1e-6, tie_word_embeddings=True),
    "llama-3.2-3b": dict(model_type="llama", hidden_size=3072, num_hidden_layers=28,
                         num_attention_heads=24, num_key_value_heads=8, intermediate_size=8192,
                         vocab_size=128256, rope_theta=500000.0, max_position_embeddings=131072,
                         rms_norm_eps=1e-5, tie_word_embeddings=True,
                         rope_scaling={"rope_type": "llama3", "factor": 32.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 8192}),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def tensors(config, generator):
    """The checkpoint's tensors, named as transformers names them, bf16."""
    h, layers = config["hidden_size"], config["num_hidden_layers"]
    heads, kv = config["num_attention_heads"], config["num_key_value_heads"]
    d = h // heads
    inter, vocab = config["intermediate_size"], config["vocab_size"]

    def randn(*shape):
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    out = {"model.embed_tokens.weight": randn(vocab, h),
           "model.norm.weight": torch.ones(h, dtype=torch.bfloat16)}
    for i in range(layers):
        p = f"model.layers.{i}."
        out[p + "self_attn.q_proj.weight"] = randn(heads * d, h)
        out[p + "self_attn.k_proj.weight"] = randn(kv * d, h)
        out[p + "self_attn.v_proj.weight"] = randn(kv * d, h)
        out[p + "self_attn.o_proj.weight"] = randn(h, heads * d)
        if config["model_type"] == "qwen2":
            out[p + "self_attn.q_proj.bias"] = randn(heads * d)
            out[p + "self_attn.k_proj.bias"] = randn(kv * d)
            out[p + "self_attn.v_proj.bias"] = randn(kv * d)
        out[p + "mlp.gate_proj.weight"] = randn(inter, h)
        out[p + "mlp.up_proj.weight"] = randn(inter, h)
        out[p + "mlp.down_proj.weight"] = randn(h, inter)
        out[p + "input_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
        out[p + "post_attention_layernorm.weight"] = torch.ones(h, dtype=torch.bfloat16)
    if not config["tie_word_embeddings"]:
        out["lm_head.weight"] = randn(vocab, h)
    return out


def write_safetensors(path, named):
    """The safetensors format: an 8-byte little-endian header length, the JSON header (each
    tensor's dtype, shape and byte range), then the tensors' bytes in that order."""
    header, offset = {}, 0
    for name, t in named.items():
        size = t.numel() * t.element_size()
        header[name] = {"dtype": "BF16", "shape": list(t.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for t in named.values():
            f.write(t.contiguous().view(torch.int16).numpy().tobytes())


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", required=True, choices=sorted(SHAPES))
    parser.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = SHAPES[args.shape]
    config = dict(shape, architectures=["Qwen2ForCausalLM" if shape["model_type"] == "qwen2"
                                        else "LlamaForCausalLM"],
                  head_dim=shape["hidden_size"] // shape["num_attention_heads"],
                  hidden_act="silu", torch_dtype="bfloat16", bos_token_id=1, eos_token_id=2)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    named = tensors(config, torch.Generator().manual_seed(args.seed))
    write_safetensors(os.path.join(args.out, "model.safetensors"), named)
    for name in TOKENIZER_FILES:
        if os.path.exists(os.path.join(args.tokenizer, name)):
            shutil.copy(os.path.join(args.tokenizer, name), args.out)
    params = sum(t.numel() for t in named.values())
    print(f"random_llm: {args.shape}, {params / 1e9:.2f} B parameters, written to {args.out}")


if __name__ == "__main__":
    main()
