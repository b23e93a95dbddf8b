#!/usr/bin/env python3
"""LoRA adapters on GGUF base models, and llama.cpp's LoRA GGUF files, through the real
`sluice serve`. For the tiny 'llama' GGUF file (q and k rows in llama.cpp's rotary layout) and the
'qwen2' one (transformers' layout), a random PEFT adapter of all seven projections is served both
from PEFT's folder and written as llama.cpp's LoRA GGUF file (its converter's names, metadata and
q/k permutation); each one's greedy continuations equal llama.cpp's own with the GGUF adapter
(llama-cpp-python), token for token, alone and batched with the base model. On the Hugging
Face-layout tiny model the GGUF adapter gives what its PEFT folder gives (checked against PEFT
by openai_lora_test). The refusals: an adapter of another architecture or shape, a model file given
as an adapter.

Usage: tests/openai_lora_gguf_test.py SLUICE TEST_MODELS
"""
import json
import os
import sys
import tempfile
import threading

import gguf
import llama_cpp
import numpy as np
import peft
import torch
import transformers
from safetensors.torch import load_file

from openai_api_test import check, raw
from sluice_server import serving, write_model

RANK, ALPHA, TOKENS = 8, 16, 12
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GGUF_NAMES = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
              "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
HEADS, KV_HEADS = 4, 2


def hf_model(arch):
    """A model of the GGUF test models' shape (tools/gguf_models.py): its adapters fit them."""
    shape = dict(vocab_size=384, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                 num_attention_heads=HEADS, num_key_value_heads=KV_HEADS)
    if arch == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**shape))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**shape))


def make_peft(base, out, seed):
    torch.manual_seed(seed)
    model = peft.get_peft_model(base, peft.LoraConfig(
        r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, init_lora_weights=False))
    with torch.no_grad():  # Large enough to change what the model says.
        for module in model.modules():
            if isinstance(module, peft.tuners.lora.LoraLayer):
                module.lora_B["default"].weight.normal_(0, 0.1)
    model.save_pretrained(out)


def permute(weights, n_head):
    """llama.cpp's converter's rotary permutation of a 'llama' file's q and k rows."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def write_gguf_adapter(peft_dir, arch, path, heads=HEADS, kv_heads=KV_HEADS):
    """The PEFT adapter as llama.cpp's convert_lora_to_gguf.py writes it (q and k permuted for
    'llama' over `heads` and `kv_heads`)."""
    tensors = load_file(os.path.join(peft_dir, "adapter_model.safetensors"))
    writer = gguf.GGUFWriter(path, arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(ALPHA))
    for key in sorted(tensors):
        if not key.endswith("lora_A.weight"):
            continue
        layer = int(key.split(".")[4])
        module = key.split(".")[6]
        a, b = tensors[key], tensors[key.replace("lora_A", "lora_B")]
        if arch == "llama" and module in ("q_proj", "k_proj"):
            b = permute(b, heads if module == "q_proj" else kv_heads)
        name = f"blk.{layer}.{GGUF_NAMES[module]}.weight"
        writer.add_tensor(name + ".lora_a", a.float().numpy())
        writer.add_tensor(name + ".lora_b", b.float().contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def llama_cpp_greedy(model_path, lora_path, prompts):
    llm = llama_cpp.Llama(model_path=model_path, lora_path=lora_path, logits_all=True, n_ctx=256,
                          n_batch=256,
                          n_threads=os.cpu_count() or 1, verbose=False)
    out = []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        greedy = []
        for _ in range(TOKENS):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            greedy.append(token)
            llm.eval([token])
        out.append(greedy)
    del llm
    return out


def complete(port, model, ids):
    status, _, body = raw(port, "POST", "/v1/completions", {
        "model": model, "prompt": ids, "max_tokens": TOKENS, "temperature": 0,
        "ignore_eos": True}, key=None)
    check(status == 200, f"{model}: {status} {body[:300]}")
    return json.loads(body)["choices"][0]["text"]


def detokenize(port, ids):
    _, _, body = raw(port, "POST", "/detokenize", {"tokens": ids}, key=None)
    return json.loads(body)["prompt"]


def gguf_base(sluice, test_models, arch, work):
    base_file = os.path.join(test_models, f"gguf_{arch}_f32", "model.gguf")
    reference = load_file(os.path.join(test_models, f"gguf_{arch}_f32", "reference.safetensors"))
    prompts = [reference[f"input_ids_{i}"].tolist() for i in range(3)]
    peft_dir = os.path.join(work, f"{arch}_peft")
    make_peft(hf_model(arch), peft_dir, seed=7)
    gguf_file = os.path.join(work, f"{arch}_lora.gguf")
    write_gguf_adapter(peft_dir, arch, gguf_file)
    expected = {"m": llama_cpp_greedy(base_file, None, prompts),
                "lora": llama_cpp_greedy(base_file, gguf_file, prompts)}
    check(expected["lora"] != expected["m"], f"{arch}: the adapter changes nothing")

    model_dir = os.path.join(work, f"{arch}_model")
    os.makedirs(model_dir)
    os.symlink(base_file, os.path.join(model_dir, "model.gguf"))
    with open(os.path.join(model_dir, "config.yaml"), "w") as f:
        f.write("llm:\n  precision: fp32\n  context_length: 256\n  lora:\n    max_loras: 2\n"
                f"    max_lora_rank: {RANK}\n    adapters:\n      peft: {peft_dir}\n"
                f"      gguf: {gguf_file}\n")
    with serving(sluice, ["--model-dir", model_dir, "--model-name", "m",
                          "--llm-threads", "1"]) as port:
        want = {m: [detokenize(port, ids) for ids in rows] for m, rows in expected.items()}
        for model, rows in (("m", want["m"]), ("peft", want["lora"]), ("gguf", want["lora"])):
            for ids, text in zip(prompts, rows):
                got = complete(port, model, ids)
                check(got == text, f"{arch} {model}: {got!r}, llama.cpp {text!r}")
        # Batched: both adapters and the base in the same steps.
        results, threads = {}, []
        for model in ("m", "peft", "gguf"):
            for i, ids in enumerate(prompts):
                def run(model=model, i=i, ids=ids):
                    results[(model, i)] = complete(port, model, ids)
                threads.append(threading.Thread(target=run))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for (model, i), got in results.items():
            text = want["m" if model == "m" else "lora"][i]
            check(got == text, f"{arch} batched {model}: {got!r}, llama.cpp {text!r}")
    print(f"  {arch}: the PEFT folder and the GGUF file each equal llama.cpp's greedy tokens")
    return gguf_file


def hf_base(sluice, test_models, work, llama_gguf_adapter):
    """The tiny Hugging Face-layout model: its adapter from PEFT's folder and as GGUF agree; a
    GGUF adapter of another shape or architecture is refused by name."""
    tiny = os.path.join(test_models, "tiny_llm")
    peft_dir = os.path.join(work, "tiny_peft")
    make_peft(transformers.AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32),
              peft_dir, seed=8)
    config = json.load(open(os.path.join(tiny, "config.json")))
    gguf_file = os.path.join(work, "tiny_lora.gguf")
    write_gguf_adapter(peft_dir, "llama", gguf_file, config["num_attention_heads"],
                       config["num_key_value_heads"])
    qwen2_file = os.path.join(work, "qwen2_lora.gguf")
    model_dir = os.path.join(work, "tiny_model")
    os.makedirs(model_dir)
    write_model(test_models, model_dir, config_yaml=(
        "llm:\n  precision: fp32\n  context_length: 256\n  lora:\n    max_loras: 3\n"
        f"    max_lora_rank: {RANK}\n    runtime_loading: true\n    adapters:\n"
        f"      peft: {peft_dir}\n      gguf: {gguf_file}\n"))
    with serving(sluice, ["--model-dir", model_dir, "--model-name", "m",
                          "--llm-threads", "1"]) as port:
        for prompt in ([5, 6, 7, 8], [40, 41, 42, 43, 44, 45]):
            base, by_peft, by_gguf = (complete(port, m, prompt) for m in ("m", "peft", "gguf"))
            check(by_peft == by_gguf and by_peft != base,
                  f"tiny: PEFT {by_peft!r}, GGUF {by_gguf!r}, base {base!r}")
        for path, words in ((llama_gguf_adapter, "has shape"), (qwen2_file, "'qwen2'"),
                            (os.path.join(test_models, "gguf_llama_f32", "model.gguf"),
                             "not 'adapter'")):
            status, _, body = raw(port, "POST", "/v1/load_lora_adapter",
                                  {"lora_name": "bad", "lora_path": path}, key=None)
            error = json.loads(body).get("error", {})
            check(status == 400 and words in error.get("message", ""),
                  f"{path}: {status} {body[:300]}")
    print("  tiny_llm: the GGUF file gives what the PEFT folder gives; the refusals")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    with tempfile.TemporaryDirectory() as work:
        llama_adapter = gguf_base(sluice, test_models, "llama", work)
        gguf_base(sluice, test_models, "qwen2", work)
        hf_base(sluice, test_models, work, llama_adapter)
    print("openai_lora_gguf_test: all checks passed")


if __name__ == "__main__":
    main()
