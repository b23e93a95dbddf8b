#!/usr/bin/env python3
"""Writes GGUF files in the exact shapes of the language models people run, with random weights,
for the benchmarks at real sizes (nothing is downloaded).

Each shape is a transformers model of the real one's class and sizes (tools/gguf_models.py's
hf_model: Qwen2ForCausalLM, LlamaForCausalLM), its weights random, its embedding as many rows as
the real vocabulary (SmolLM2's tokenizer, the token list padded with unused tokens to that size),
written as an F16 GGUF and quantised by llama.cpp's own quantiser (llama-cpp-python's
llama_model_quantize) to each type asked for; IQ2_XS, which that quantiser makes only with an
importance matrix, with llama-imatrix's statistics of the F16 model run over 1,024 tokens of text
(from llama.cpp's own forward pass), as tools/converted_models.py makes its test files. Random
weights decode noise: measure with fixed output lengths (ignore_eos).

  qwen2.5-0.5b   Qwen2.5-0.5B: hidden 896, 24 layers, 14 heads / 2 KV heads of 64, FFN 4864,
                 vocab 151936, tied; 0.49 B parameters
  llama-3.2-1b   Llama-3.2-1B: hidden 2048, 16 layers, 32 / 8 heads of 64, FFN 8192,
                 vocab 128256, tied; 1.24 B
  llama-3.2-3b   Llama-3.2-3B: hidden 3072, 28 layers, 24 / 8 heads of 128, FFN 8192,
                 vocab 128256, tied; 3.21 B
  qwen3-30b-a3b-x8
                 8 of Qwen3-30B-A3B's 48 layers (a mixture of experts): hidden 2048, 32 / 4
                 heads of 128, 128 experts of 768 a layer, 8 used a token, vocab 151936,
                 untied; 5.6 B parameters, 0.76 B of them read a token (the output head 0.31 B,
                 the chosen experts 0.30 B); made only when --shapes names it (11 GB of F16)
  gpt-oss-20b-x4 4 of gpt-oss-20b's 24 layers: hidden 2880, 64 / 8 heads of 64 with sinks, 32
                 experts of 2880 a layer, 4 used a token, windows of 128 on every other layer,
                 YaRN, vocab 201088, untied; 4.5 B parameters, 0.98 B of them read a token (the
                 output head 0.58 B, the chosen experts 0.40 B). Written as gpt-oss's own files
                 are made: a transformers GptOssForCausalLM (bf16) saved by save_pretrained and
                 converted by llama.cpp's convert_hf_to_gguf.py (F16), for the mxfp4_moe type
                 (its released files' types: the experts MXFP4, the rest Q8_0); only when
                 --shapes names it (9 GB of F16)

Files: OUT/<shape>_<type>/model.gguf (a directory `sluice serve --model-dir` takes), the F16
source at OUT/<shape>_f16/model.gguf. Existing files are kept. Several GB each (the 3B shape's
F16 file is 6.4 GB, its five types 12 GB): OUT defaults to models/real-sizes, which git ignores.
The F16 source of a shape takes 1 to 5 minutes on 2 cores, each quantisation 1 to 3.

Usage: benchmarks/real_size_models.py [--out models/real-sizes]
           [--shapes qwen2.5-0.5b,llama-3.2-1b,llama-3.2-3b] [--types q4_k_m,q5_k_m,q6_k,q8_0,q4_0]
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
import converted_models  # noqa: E402
import gguf_models  # noqa: E402

SHAPES = {
    "qwen2.5-0.5b": ("qwen2", dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                                   num_key_value_heads=2, intermediate_size=4864,
                                   tie_word_embeddings=True), 151936),
    "llama-3.2-1b": ("llama", dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, intermediate_size=8192,
                                   tie_word_embeddings=True), 128256),
    "llama-3.2-3b": ("llama", dict(hidden_size=3072, num_hidden_layers=28, num_attention_heads=24,
                                   num_key_value_heads=8, intermediate_size=8192, head_dim=128,
                                   tie_word_embeddings=True), 128256),
    "gpt-oss-20b-x4": ("gpt_oss", dict(hidden_size=2880, num_hidden_layers=4,
                                       num_attention_heads=64, num_key_value_heads=8, head_dim=64,
                                       intermediate_size=2880, num_local_experts=32,
                                       num_experts_per_tok=4, sliding_window=128,
                                       max_position_embeddings=131072,
                                       tie_word_embeddings=False), 201088),
    "qwen3-30b-a3b-x8": ("qwen3moe", dict(hidden_size=2048, num_hidden_layers=8,
                                          num_attention_heads=32, num_key_value_heads=4,
                                          head_dim=128, intermediate_size=6144,
                                          moe_intermediate_size=768, num_experts=128,
                                          num_experts_per_tok=8, norm_topk_prob=True,
                                          tie_word_embeddings=False), 151936),
}
TYPES = ["q4_k_m", "q5_k_m", "q6_k", "q8_0", "q4_0"]
CONTEXT = 32768  # The files' context length: the long-context benchmarks go to 32k tokens.


def tokenizer(tokenizer_dir):
    path = os.path.join(tokenizer_dir, "tokenizer.json")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run tools/llm_export.py --test --out build/test-models "
                 "first (make models does)")
    config = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))
    return json.load(open(path)), config.get("chat_template", "")


def write_source(out_dir, shape, tokenizer_json, chat_template, tokenizer_dir):
    """The shape's F16 file: a random model of the real class, bf16 in memory."""
    path = os.path.join(out_dir, f"{shape}_f16", "model.gguf")
    if os.path.exists(path):
        return path
    arch, sizes, vocab = SHAPES[shape]
    start = time.time()
    if arch == "gpt_oss":
        return write_converted_source(path, sizes, vocab, tokenizer_dir, start)
    torch.set_default_dtype(torch.bfloat16)  # A 3B model's fp32 weights and copies would not fit.
    try:
        model = gguf_models.hf_model(arch, vocab, seed=7, max_position_embeddings=CONTEXT,
                                     **sizes)
    finally:
        torch.set_default_dtype(torch.float32)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    partial = path + ".partial"
    gguf_models.write_gguf(partial, arch, model, tokenizer_json, chat_template, vocab_size=vocab,
                           matrix_dtype=np.float16, model_name=f"sluice-{shape}-random")
    os.replace(partial, path)
    params = sum(p.numel() for p in model.parameters())
    print(f"{path}: {params / 1e9:.2f} B parameters, {os.path.getsize(path) / 1e9:.2f} GB, "
          f"{time.time() - start:.0f} s", flush=True)
    return path


def write_converted_source(path, sizes, vocab, tokenizer_dir, start):
    """A gpt-oss shape as its files are made: transformers' class, save_pretrained (bf16), then
    llama.cpp's converter to F16 (the vocabulary: SmolLM2's, which the converter pads to the
    shape's with unused tokens; its pre-tokenizer answered as gpt-oss's, GPT-4o's)."""
    import shutil
    import transformers
    import encoder_models
    hf = os.path.join(os.path.dirname(path), "hf")
    if not os.path.exists(os.path.join(hf, "config.json")):
        converted_models.copy_tokenizer(tokenizer_dir, hf)
        config = transformers.GptOssConfig(vocab_size=vocab, **sizes)
        torch.manual_seed(7)
        torch.set_default_dtype(torch.bfloat16)
        try:
            model = transformers.GptOssForCausalLM(config)
            with torch.no_grad():
                for name, parameter in model.named_parameters():
                    if parameter.dim() >= 2:
                        parameter.normal_(0, 0.02)
                    elif "norm" in name:
                        parameter.fill_(1.0)
                    else:
                        parameter.normal_(0, 0.1)
            model.save_pretrained(hf)
            params = sum(p.numel() for p in model.parameters())
            del model
        finally:
            torch.set_default_dtype(torch.float32)
        print(f"{hf}: {params / 1e9:.2f} B parameters, {time.time() - start:.0f} s", flush=True)
    partial = path + ".partial"
    encoder_models.convert_with_pre_tokenizer(hf, partial, "gpt-4o", outtype="f16")
    os.replace(partial, path)
    shutil.rmtree(hf)
    print(f"{path}: {os.path.getsize(path) / 1e9:.2f} GB, {time.time() - start:.0f} s", flush=True)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="models/real-sizes")
    parser.add_argument("--shapes", default="qwen2.5-0.5b,llama-3.2-1b,llama-3.2-3b")
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--tokenizer", default="build/test-models/smollm2_tokenizer",
                        help="the directory of SmolLM2's tokenizer.json and tokenizer_config.json")
    args = parser.parse_args()
    shapes, types = args.shapes.split(","), args.types.split(",")
    unknown = [s for s in shapes if s not in SHAPES]
    if unknown:
        sys.exit(f"unknown shapes {unknown}: {', '.join(SHAPES)}")
    import transformers
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    tokenizer_json, chat_template = tokenizer(args.tokenizer)
    for shape in shapes:
        source = write_source(args.out, shape, tokenizer_json, chat_template, args.tokenizer)
        for kind in types:
            path = os.path.join(args.out, f"{shape}_{kind}", "model.gguf")
            if os.path.exists(path):
                continue
            start = time.time()
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if kind in converted_models.IMATRIX_TYPES:
                rng = np.random.default_rng(7)
                words = ("the model serves tokens quickly and the cache keeps every key and value "
                         "of each sequence while the batch grows").split()
                text = "\n".join(" ".join(rng.choice(words, 64)) for _ in range(40))
                converted_models.quantize_with_imatrix(source, path + ".partial", kind, text)
            else:
                gguf_models.quantize(source, path + ".partial", kind)
            os.replace(path + ".partial", path)
            print(f"{path}: {os.path.getsize(path) / 1e9:.2f} GB, {time.time() - start:.0f} s",
                  flush=True)


if __name__ == "__main__":
    main()
