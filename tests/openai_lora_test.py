#!/usr/bin/env python3
"""LoRA adapters through the real `sluice serve`: four PEFT adapters of the tiny test model
(random weights, ranks 2-16, different target modules, one with rsLoRA), two listed in
config.yaml and two loaded at run time (vLLM's /v1/load_lora_adapter); each adapter's greedy
completion equal to transformers + PEFT's, token for token, alone and with requests for every
adapter and the base model batched into the same steps; /v1/models' parents; unloading; the
gateway's vllm:lora_requests_info; and the refusals.

Usage: tests/openai_lora_test.py SLUICE TEST_MODELS
"""
import json
import os
import re
import sys
import tempfile
import threading

import peft
import torch
import transformers

from openai_api_test import check, raw
from sluice_server import serving, templated_model

ADAPTERS = {  # name: (rank, alpha, targets, rsLoRA)
    "a0": (4, 8, ["q_proj", "v_proj"], False),
    "a1": (8, 16, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
           False),
    "a2": (16, 8, ["o_proj", "down_proj"], True),
    "a3": (2, 4, ["gate_proj", "up_proj"], False),
}
PROMPTS = ["hello world", "the quick brown fox", "serving models batch latency"]
TOKENS = 16


def make_adapters(base_dir, out):
    """The adapters, saved in PEFT's layout: random A and B (PEFT's default B is zero)."""
    for seed, (name, (rank, alpha, targets, rslora)) in enumerate(ADAPTERS.items()):
        torch.manual_seed(100 + seed)
        base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets,
                                 init_lora_weights=False, use_rslora=rslora)
        model = peft.get_peft_model(base, config)
        with torch.no_grad():  # Large enough to change what the model says.
            for module in model.modules():
                if isinstance(module, peft.tuners.lora.LoraLayer):
                    module.lora_B["default"].weight.normal_(0, 0.5)
        model.save_pretrained(os.path.join(out, name))


def reference(base_dir, adapters_dir, prompt_ids):
    """transformers (+ PEFT) greedy continuations: {model: [ids per prompt]}."""
    out = {}
    for name in [None, *ADAPTERS]:
        model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
        if name:
            model = peft.PeftModel.from_pretrained(model, os.path.join(adapters_dir, name))
        model.eval()
        rows = []
        for ids in prompt_ids:
            with torch.no_grad():
                generated = model.generate(torch.tensor([ids]), max_new_tokens=TOKENS,
                                           min_new_tokens=TOKENS, do_sample=False,
                                           pad_token_id=0)
            rows.append(generated[0, len(ids):].tolist())
        out[name or "m"] = rows
    return out


def complete(port, model, prompt):
    status, _, body = raw(port, "POST", "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": TOKENS, "temperature": 0,
        "ignore_eos": True, "logprobs": 0}, key=None)
    check(status == 200, f"{model}: {status} {body[:300]}")
    return json.loads(body)["choices"][0]


def checks(port, tokenizer, expected, adapters_dir):
    def text(ids):
        # Decoded by Sluice: the same tokens give the same text (transformers writes invalid
        # UTF-8 with fewer replacement characters).
        _, _, body = raw(port, "POST", "/detokenize", {"tokens": ids}, key=None)
        return json.loads(body)["prompt"]

    # Alone, one request at a time.
    for model in ["m", *ADAPTERS]:
        for prompt, ids in zip(PROMPTS, expected[model]):
            got = complete(port, model, prompt)["text"]
            check(got == text(ids), f"{model} on {prompt!r}: {got!r}, transformers "
                                    f"{text(ids)!r}")
    differ = [m for m in ADAPTERS if expected[m] != expected["m"]]
    check(len(differ) == len(ADAPTERS), f"adapters that change nothing: "
                                        f"{set(ADAPTERS) - set(differ)}")
    # All at once: every adapter and the base in the same steps.
    results, threads = {}, []
    for model in ["m", *ADAPTERS]:
        for prompt in PROMPTS:
            def run(model=model, prompt=prompt):
                results[(model, prompt)] = complete(port, model, prompt)["text"]
            threads.append(threading.Thread(target=run))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for model in ["m", *ADAPTERS]:
        for prompt, ids in zip(PROMPTS, expected[model]):
            check(results[(model, prompt)] == text(ids), f"batched {model} on {prompt!r}: "
                                                         f"{results[(model, prompt)]!r}")

    # /v1/models: the base and each adapter with its parent.
    status, _, body = raw(port, "GET", "/v1/models", key=None)
    models = {m["id"]: m.get("parent") for m in json.loads(body)["data"]}
    check(models == {"m": None, "a0": "m", "a1": "m", "a2": "m", "a3": "m"}, f"models: {models}")
    # The gateway's LoRA gauge.
    _, _, body = raw(port, "GET", "/metrics", key=None)
    check(re.search(r'^vllm:lora_requests_info\{model_name="m",max_lora="4",'
                    r'running_lora_adapters="[^"]*",waiting_lora_adapters="[^"]*"\} \d',
                    body.decode(), re.M), "no vllm:lora_requests_info")

    # Refusals, by name.
    for path, request, code, param in [
            ("/v1/load_lora_adapter", {"lora_name": "a4", "lora_path": os.path.join(
                adapters_dir, "a0")}, 400, "lora_path"),  # max_loras reached.
            ("/v1/load_lora_adapter", {"lora_name": "a0", "lora_path": "/nowhere"}, 400,
             "lora_name"),
            ("/v1/load_lora_adapter", {"lora_name": "a b", "lora_path": "/x"}, 400, "lora_name"),
            ("/v1/unload_lora_adapter", {"lora_name": "nope"}, 404, "lora_name")]:
        status, _, body = raw(port, "POST", path, request, key=None)
        error = json.loads(body).get("error", {})
        check(status == code and error.get("param") == param, f"{request}: {status} {body[:300]}")
    # Unloaded, an adapter is gone; loaded again, it answers as before.
    status, _, body = raw(port, "POST", "/v1/unload_lora_adapter", {"lora_name": "a3"}, key=None)
    check(status == 200, f"unload: {status} {body[:200]}")
    status, _, body = raw(port, "POST", "/v1/completions", {"model": "a3", "prompt": "x"},
                          key=None)
    check(status == 404, f"unloaded adapter: {status}")
    # What is not served is refused at load, naming it.
    source = os.path.join(adapters_dir, "a0")
    for change, words in [({"use_dora": True}, "DoRA"), ({"r": 32}, "max_lora_rank is 16"),
                          ({"bias": "all"}, "biases"), ({"peft_type": "IA3"}, "only LORA"),
                          ({"modules_to_save": ["lm_head"]}, "modules_to_save"),
                          (None, "holds both")]:
        with tempfile.TemporaryDirectory() as bad:
            for name in os.listdir(source):
                os.symlink(os.path.join(source, name), os.path.join(bad, name))
            if change is None:
                open(os.path.join(bad, "adapter.gguf"), "wb").close()
            else:
                with open(os.path.join(source, "adapter_config.json")) as f:
                    config = {**json.load(f), **change}
                os.remove(os.path.join(bad, "adapter_config.json"))
                with open(os.path.join(bad, "adapter_config.json"), "w") as f:
                    json.dump(config, f)
            status, _, body = raw(port, "POST", "/v1/load_lora_adapter",
                                  {"lora_name": "bad", "lora_path": bad}, key=None)
            error = json.loads(body).get("error", {})
            check(status == 400 and error.get("param") == "lora_path" and
                  words in error.get("message", ""), f"{change}: {status} {body[:300]}")
    status, _, body = raw(port, "POST", "/v1/load_lora_adapter", {
        "lora_name": "a3", "lora_path": os.path.join(adapters_dir, "a3")}, key=None)
    check(status == 200, f"reload: {status} {body[:200]}")
    check(complete(port, "a3", PROMPTS[0])["text"] == text(expected["a3"][0]), "reloaded a3")
    status, _, body = raw(port, "POST", "/v1/load_lora_adapter", {
        "lora_name": "big", "lora_path": os.path.join(adapters_dir, "a2")}, key=None)
    check(status == 400, f"a fifth adapter: {status}")


def main():
    sluice, test_models = sys.argv[1], os.path.abspath(sys.argv[2])
    base_dir = os.path.join(test_models, "tiny_llm")
    tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
    template = open(os.path.join(base_dir, "chat_template.jinja")).read()
    with tempfile.TemporaryDirectory() as adapters_dir:
        make_adapters(base_dir, adapters_dir)
        prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
        expected = reference(base_dir, adapters_dir, prompt_ids)
        config = ("llm:\n  precision: fp32\n  context_length: 256\n  lora:\n    max_loras: 4\n"
                  "    max_lora_rank: 16\n    runtime_loading: true\n    adapters:\n"
                  f"      a0: {os.path.join(adapters_dir, 'a0')}\n"
                  f"      a1: {os.path.join(adapters_dir, 'a1')}\n")
        with templated_model(test_models, template, config) as model:
            with serving(sluice, ["--model-dir", model, "--model-name", "m",
                                  "--llm-threads", "1"]) as port:
                # Ids as Sluice tokenizes the prompts, the same as transformers'.
                for prompt, ids in zip(PROMPTS, prompt_ids):
                    _, _, body = raw(port, "POST", "/tokenize", {"prompt": prompt}, key=None)
                    check(json.loads(body)["tokens"] == ids, f"tokens of {prompt!r}")
                for name in ("a2", "a3"):
                    status, _, body = raw(port, "POST", "/v1/load_lora_adapter", {
                        "lora_name": name, "lora_path": os.path.join(adapters_dir, name)},
                        key=None)
                    check(status == 200, f"load {name}: {status} {body[:300]}")
                checks(port, tokenizer, expected, adapters_dir)
    print("openai_lora_test: all checks passed")


if __name__ == "__main__":
    main()
