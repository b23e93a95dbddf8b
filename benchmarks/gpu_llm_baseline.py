#!/usr/bin/env python3
"""The LitServe seed's language-model loop in PyTorch alone, on a GPU: a Llama or Qwen2 folder
(tools/random_llm.py's, or any with config.json + model.safetensors) decoded greedily with a static
KV cache, in three variants as the seed runs them:

  eager      the model in bf16, one token a step (the seed's baseline);
  compiled   the same decode step under torch.compile(mode="reduce-overhead"): CUDA graphs over a
             static cache (the seed's static cache + torch.compile);
  int8       compiled, its linear layers' weights int8 per output channel, dequantised inside the
             compiled step (the seed's 8-bit weights; bitsandbytes' wheel carries CUDA binaries
             too large for the GPU check's bundle, so its weight-only int8 is written here).

The forward is transformers' (RMSNorm, RoPE on halves, grouped-query attention, SwiGLU; Qwen2's
q/k/v biases; Llama 3's RoPE scaling): --check-reference holds it, in fp32 on the CPU, to the
logits transformers wrote beside a test model (tiny_llm/reference.safetensors), so its figures are
those of the model Sluice serves.

For each variant and batch size: TPOT (ms a decode step, median over --tokens steps after warm-up)
and output tokens/s. Writes JSON to --out.

Usage: benchmarks/gpu_llm_baseline.py --model DIR [--batch-sizes 1] [--tokens 128]
                                      [--variants eager,compiled,int8] [--out FILE]
       benchmarks/gpu_llm_baseline.py --model build/test-models/tiny_llm --check-reference
"""
import argparse
import json
import math
import os
import statistics
import struct
import time

import torch
import torch.nn.functional as F

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
          "I64": torch.int64}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    body = memoryview(data)[8 + length:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, end = entry["data_offsets"]
        t = torch.frombuffer(bytearray(body[start:end]), dtype=DTYPES[entry["dtype"]])
        out[name] = t.reshape(entry["shape"])
    return out


def rope_frequencies(config, d):
    # transformers 5 writes rope_parameters; earlier versions rope_theta and rope_scaling.
    parameters = config.get("rope_parameters") or {}
    theta = config.get("rope_theta") or parameters.get("rope_theta", 10000.0)
    inv = 1.0 / (theta ** (torch.arange(0, d, 2).float() / d))
    scaling = config.get("rope_scaling") or parameters
    if scaling.get("rope_type", scaling.get("type")) == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], \
            scaling["high_freq_factor"]
        original = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > original / low, inv / factor, inv)
        smooth = (original / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= original / high) & (wavelen <= original / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Model:
    """The decoder over a static cache [layers][batch, KV heads, max_len, head_dim]."""

    def __init__(self, folder, dtype, device, int8=False):
        with open(os.path.join(folder, "config.json")) as f:
            self.config = c = json.load(f)
        self.h, self.layers = c["hidden_size"], c["num_hidden_layers"]
        self.heads, self.kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.d = c.get("head_dim") or self.h // self.heads
        self.eps = c.get("rms_norm_eps", 1e-6)
        w = read_safetensors(os.path.join(folder, "model.safetensors"))
        self.dtype, self.device, self.int8 = dtype, device, int8
        on = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
        self.embed = on(w["model.embed_tokens.weight"])
        self.norm = w["model.norm.weight"].to(device=device, dtype=torch.float32)
        head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
        self.lm_head = self.linear(head)
        self.blocks = []
        for i in range(self.layers):
            p = f"model.layers.{i}."
            qkv = torch.cat([w[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
            bias = None
            if p + "self_attn.q_proj.bias" in w:
                bias = torch.cat([w[p + f"self_attn.{n}_proj.bias"] for n in "qkv"]).to(
                    device=device, dtype=torch.float32)
            gate_up = torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
            self.blocks.append(dict(
                attn_norm=w[p + "input_layernorm.weight"].to(device, torch.float32),
                ffn_norm=w[p + "post_attention_layernorm.weight"].to(device, torch.float32),
                qkv=self.linear(qkv), qkv_bias=bias, out=self.linear(w[p + "self_attn.o_proj.weight"]),
                gate_up=self.linear(gate_up), down=self.linear(w[p + "mlp.down_proj.weight"])))
        self.inv_freq = rope_frequencies(c, self.d).to(device)

    def linear(self, weight):
        if not self.int8:
            return (weight.to(device=self.device, dtype=self.dtype), None)
        w = weight.float()
        scales = w.abs().amax(1).clamp(min=1e-8) / 127
        q = torch.round(w / scales[:, None]).clamp(-127, 127).to(torch.int8)
        return (q.to(self.device), scales.to(device=self.device, dtype=self.dtype))

    def apply(self, x, layer):
        weight, scales = layer
        if scales is None:
            return F.linear(x.to(self.dtype), weight).float()
        return (F.linear(x.to(self.dtype), weight.to(self.dtype)) * scales).float()

    def rms(self, x, weight):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * weight

    def rotate(self, x, positions):
        freqs = positions[:, :, None].float() * self.inv_freq  # [B, T, D/2]
        cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]  # [B, 1, T, D/2]
        x1, x2 = x[..., : self.d // 2], x[..., self.d // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    def new_cache(self, batch, max_len):
        shape = (batch, self.kv, max_len, self.d)
        return [(torch.zeros(shape, device=self.device, dtype=self.dtype),
                 torch.zeros(shape, device=self.device, dtype=self.dtype))
                for _ in range(self.layers)]

    def forward(self, tokens, positions, cache):
        """tokens, positions: [B, T] (positions the same for every sequence); the logits of the
        last token, fp32 [B, vocab]. Writes the tokens' keys and values into `cache`."""
        b, t = tokens.shape
        x = self.embed[tokens].float()
        max_len = cache[0][0].shape[2]
        keys_at = torch.arange(max_len, device=tokens.device)
        mask = keys_at[None, :] <= positions[0][:, None]  # [T, max_len]
        for blk, (k_cache, v_cache) in zip(self.blocks, cache):
            qkv = self.apply(self.rms(x, blk["attn_norm"]), blk["qkv"])
            if blk["qkv_bias"] is not None:
                qkv = qkv + blk["qkv_bias"]
            q, k, v = qkv.split([self.heads * self.d, self.kv * self.d, self.kv * self.d], -1)
            q = self.rotate(q.view(b, t, self.heads, self.d).transpose(1, 2), positions)
            k = self.rotate(k.view(b, t, self.kv, self.d).transpose(1, 2), positions)
            v = v.view(b, t, self.kv, self.d).transpose(1, 2)
            k_cache.index_copy_(2, positions[0], k.to(self.dtype))
            v_cache.index_copy_(2, positions[0], v.to(self.dtype))
            attn = F.scaled_dot_product_attention(
                q.to(self.dtype), k_cache, v_cache, attn_mask=mask, enable_gqa=True)
            x = x + self.apply(attn.transpose(1, 2).reshape(b, t, -1), blk["out"])
            gate, up = self.apply(self.rms(x, blk["ffn_norm"]), blk["gate_up"]).chunk(2, -1)
            x = x + self.apply(F.silu(gate) * up, blk["down"])
        return self.apply(self.rms(x[:, -1], self.norm), self.lm_head)


def check_reference(folder):
    """fp32 on the CPU against transformers' logits (reference.safetensors)."""
    model = Model(folder, torch.float32, "cpu")
    ref = read_safetensors(os.path.join(folder, "reference.safetensors"))
    worst = 0.0
    i = 0
    while f"input_ids_{i}" in ref:
        ids = ref[f"input_ids_{i}"].reshape(1, -1)
        want = ref[f"logits_{i}"].reshape(ids.shape[1], -1)
        cache = model.new_cache(1, ids.shape[1])
        rows = []
        for p in range(ids.shape[1]):  # Token by token: the decode path the benchmark times.
            pos = torch.tensor([[p]])
            rows.append(model.forward(ids[:, p:p + 1], pos, cache)[0])
        got = torch.stack(rows)
        worst = max(worst, ((got - want).abs().max() / want.abs().max()).item())
        i += 1
    print(f"gpu_llm_baseline: {folder}: {i} references, max |Δ| / max |logit| {worst:.2e}")
    return worst < 1e-4


def bench(model, batch, tokens, compiled):
    prompt_len = 16
    max_len = prompt_len + tokens + 8
    cache = model.new_cache(batch, max_len)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 1000, (batch, prompt_len), generator=gen).to(model.device)
    step = model.forward
    if compiled:
        step = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        positions = torch.arange(prompt_len, device=model.device)[None].expand(batch, -1)
        logits = model.forward(prompt, positions.contiguous(), cache)
        token = logits.argmax(-1, keepdim=True)
        times = []
        for i in range(tokens + 8):
            pos = torch.full((batch, 1), prompt_len + i, device=model.device, dtype=torch.long)
            torch.cuda.synchronize()
            start = time.perf_counter()
            logits = step(token, pos, cache)
            token = logits.argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            if i >= 8:  # Warm-up: compilation and graph capture.
                times.append(time.perf_counter() - start)
    tpot = statistics.median(times)
    return {"batch": batch, "tpot_ms": tpot * 1e3, "tokens_per_s": batch / tpot}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--batch-sizes", default="1")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--variants", default="eager,compiled,int8")
    parser.add_argument("--check-reference", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.check_reference:
        raise SystemExit(0 if check_reference(args.model) else 1)
    if not torch.cuda.is_available():
        raise SystemExit("gpu_llm_baseline: no CUDA device")
    results = []
    for variant in args.variants.split(","):
        model = Model(args.model, torch.bfloat16, "cuda", int8=variant == "int8")
        for batch in (int(b) for b in args.batch_sizes.split(",")):
            r = bench(model, batch, args.tokens, compiled=variant != "eager")
            r["variant"] = variant
            results.append(r)
            print(f"gpu_llm_baseline: {variant:8s} batch {batch:3d}: TPOT {r['tpot_ms']:.2f} ms, "
                  f"{r['tokens_per_s']:.0f} tokens/s")
        del model
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"model": args.model, "gpu": torch.cuda.get_device_name(0),
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
