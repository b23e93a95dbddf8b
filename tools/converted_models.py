#!/usr/bin/env python3
"""Writes test models as users get them: Hugging Face folders written by transformers'
save_pretrained, converted to GGUF by llama.cpp's own converter (convert_hf_to_gguf.py, from
llama-cpp-python's source distribution, which scripts/install-deps.sh unpacks in .deps/llama.cpp).

Everything goes to converted/ (apart from the model repository the server tests serve whole):
  spm_tokenizer/tokenizer.model     a SentencePiece BPE vocabulary (1,000 pieces, byte fallback,
                                    Llama's normaliser settings) trained here with the
                                    sentencepiece package on the tokenizer test strings
  hf_spm_llama/                     a tiny random LlamaForCausalLM with that vocabulary and four
                                    added special tokens (Phi-3's), as save_pretrained writes it (the
                                    tokenizer converted to tokenizer.json by transformers: Metaspace,
                                    byte fallback); tokenizer_cases.jsonl: the tokenizers package's
                                    ids for the strings, and its decoding of them
  hf_spm_model_only/, hf_spm_model_only_legacy/
                                    the same vocabulary as tokenizer.model alone (no
                                    tokenizer.json), tokenizer_config.json in transformers 4's form
                                    (added_tokens_decoder; legacy false, true), with transformers'
                                    ids from those folders
  hf_spm_always/, hf_spm_legacy/    the same vocabulary's tokenizer.json with Metaspace prepending
                                    to every segment, and in Llama 2's original form (a Prepend and
                                    Replace normalizer), with the tokenizers package's ids
  gguf_spm_llama_f32/model.gguf     that folder through llama.cpp's converter (tokenizer.ggml.model
                                    "llama": tokens, scores, token types); tokenizer_cases.jsonl:
                                    llama.cpp's ids for the strings; reference.safetensors:
                                    llama.cpp's logits and greedy continuations
  gguf_spm_llama_split/              the same converted with --split-max-tensors 8: three parts,
                                    model-0000N-of-00003.gguf, and llama.cpp's logits
  tiny_llm_sharded/                 tiny_llm (tools/llm_export.py) saved by save_pretrained as a
                                    sharded checkpoint (model.safetensors.index.json and shards)
  hf_<family>/, hf_<family>_sharded/
                                    a random model of each family (llama, mistral, qwen2, qwen3,
                                    phi3, gemma3) from transformers' own class, saved whole and
                                    sharded, with tiny_llm's tokenizer and transformers' logits
  gguf_<arch>_<type>/                llama, qwen2, qwen3, phi3 and gemma3 quantised by llama.cpp's
                                    quantiser to Q3_K_M, Q3_K_S, Q3_K_L, Q2_K, IQ4_XS, IQ4_NL and
                                    IQ3_S (from tools/gguf_models.py's F32 files), and to IQ2_XS
                                    with an importance matrix (llama-imatrix's statistics of the
                                    model run over text), with llama.cpp's logits
  hf_phi3_longrope/, gguf_phi3_longrope_f32/
                                    a tiny Phi-3 with LongRoPE (Phi-3.5-mini's config shape: short
                                    and long factors, an original context of 256 against 8,192,
                                    so the attention factor sqrt(1 + ln 32 / ln 256)), its attention
                                    sharp enough for positions to matter, and its GGUF:
                                    reference.safetensors, llama.cpp's logits at a 256-token context
                                    (short factors), reference_long.safetensors at 512 (long
                                    factors, a prompt past the original context), and
                                    reference_plain_rope.safetensors, llama.cpp's logits for the
                                    same weights with plain RoPE (what ignoring the factors gives);
                                    llama.cpp's KV cache in f32 for all of them; and
                                    tokenizer_cases.jsonl, llama.cpp's ids for the strings under a
                                    Phi-3's name (whitespace after special tokens dropped)
  hf_<moe>/, gguf_<moe>_f32/, gguf_<moe>_q4_k_m/, gguf_<moe>_mxfp4_moe/
                                    mixtures of experts: a tiny random Qwen3-MoE
                                    (Qwen3MoeForCausalLM: 8 experts of width 256, 2 used a token,
                                    norm_topk_prob, as Qwen3-30B-A3B routes), Mixtral
                                    (MixtralForCausalLM: 4 experts, 2 used) and gpt-oss
                                    (GptOssForCausalLM: 4 experts, 2 used, gpt-oss-20b's YaRN,
                                    sinks, biases and clamped SwiGLU, windows of 8 on the even
                                    layers; harmony's markers added to its vocabulary as special
                                    tokens), with tiny_llm's byte-level BPE vocabulary, converted
                                    by llama.cpp's converter (its pre-tokenizer check answered
                                    "qwen2", "smollm" and "gpt-4o") and quantised to Q4_K_M (not
                                    gpt-oss) and MXFP4_MOE (the experts MXFP4, as gpt-oss's are;
                                    the rest Q8_0) by its quantiser, with llama.cpp's logits (its
                                    KV cache in f32) and, for gpt-oss's F32 file,
                                    tokenizer_cases.jsonl (llama.cpp's ids for the tokenizer test
                                    strings); the folders with transformers' logits
  hf_gpt_oss_mxfp4/, gguf_gpt_oss_mxfp4_hf/
                                    hf_gpt_oss as openai/gpt-oss-20b is released: its experts as
                                    MXFP4 blocks and scales (OCP MX), the rest BF16,
                                    quantization_config mxfp4, with transformers' logits (its MXFP4
                                    reader); and the GGUF file llama.cpp's converter writes from it
                                    (the experts' blocks moved into MXFP4 tensors), with llama.cpp's
                                    logits
  hf_qwen2_yarn/, gguf_qwen2_yarn_f32/
                                    a tiny Qwen2 with YaRN (factor 4 over an original 64 positions,
                                    as Qwen2.5's long-context configs), its GGUF and llama.cpp's
                                    logits, and reference_plain_rope.safetensors likewise

Usage: tools/converted_models.py --out build/test-models
(after tools/llm_export.py --test, whose tokenizer strings it trains and tests on)
"""
import argparse
import glob
import io
import json
import os
import random
import subprocess
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERTER = os.path.join(ROOT, ".deps", "llama.cpp", "convert_hf_to_gguf.py")
SPECIAL_TOKENS = ["<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
                 "<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
VOCAB = 1000 + len(SPECIAL_TOKENS)  # The SentencePiece pieces, then the added tokens.
PROMPTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog 12345",
    "<|user|>\nserving models<|end|>\n<|assistant|>\n",
]


def llama_cpp_cases(gguf_path, texts, out_path):
    """tokenizer_cases.jsonl: llama.cpp's ids for `texts` with the file's vocabulary (special
    tokens parsed), and its detokenisation of them."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=gguf_path, vocab_only=True, verbose=False)
    rows = []
    for text in texts:
        ids = llm.tokenize(text.encode(), add_bos=False, special=True)
        rows.append((text, ids, detokenize(llm, ids)))
    del llm
    write_cases(out_path, rows)
    return rows


def train_sentencepiece(strings, path):
    """A BPE vocabulary with byte fallback and Llama 2's normaliser settings (no normalisation,
    a dummy prefix, runs of spaces kept, digits split)."""
    import sentencepiece
    # Characters of the rarer scripts and the random code points are left to byte fallback.
    corpus = [s for s in strings if all(ord(c) < 0x3000 for c in s)]
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus), model_writer=model, vocab_size=1000, model_type="bpe",
        byte_fallback=True, character_coverage=0.98, normalization_rule_name="identity",
        add_dummy_prefix=True, remove_extra_whitespaces=False, split_digits=True,
        allow_whitespace_only_pieces=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        num_threads=2, max_sentence_length=100000, minloglevel=2)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(model.getvalue())


def write_hf_llama(model_path, out, seed):
    """A tiny random Llama with the SentencePiece vocabulary, as save_pretrained writes it."""
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
    os.makedirs(out, exist_ok=True)
    with open(model_path, "rb") as src, open(os.path.join(out, "tokenizer.model"), "wb") as dst:
        dst.write(src.read())
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                   "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False,
                   "legacy": False, "model_max_length": 4096, "chat_template": CHAT_TEMPLATE}, f)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS})
    tokenizer.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, rms_norm_eps=1e-5)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # Weights large enough that the logits are not near ties.
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.08)
    model.save_pretrained(out)
    return tokenizer


# Phi-3.5-mini's LongRoPE factors have this shape: short ones from 1 to about 3, long ones from 1
# to about 60, rising with the wavelength (for 16 frequency pairs here, 48 there).
def longrope_factors(half):
    short = [round(1.0 + 2.0 * (i / (half - 1)) ** 2, 4) for i in range(half)]
    long = [round(1.0 + 60.0 * (i / (half - 1)) ** 3, 4) for i in range(half)]
    return short, long


def copy_tokenizer(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        if os.path.exists(os.path.join(src, name)):
            with open(os.path.join(src, name), "rb") as a, open(os.path.join(dst, name), "wb") as b:
                b.write(a.read())


def sharpen(model, attention_names, scale):
    """Random weights, with the query/key projections scaled up so that the attention is sharp
    and depends on the positions (random weights otherwise attend almost uniformly, and a wrong
    RoPE barely moves the logits)."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.dim() != 2:
                continue
            parameter.normal_(0, 0.08)
            if any(part in name for part in attention_names):
                parameter.mul_(scale)


def write_hf_phi3(tokenizer_dir, out, seed, longrope=True):
    from transformers import Phi3Config, Phi3ForCausalLM
    copy_tokenizer(tokenizer_dir, out)
    head_dim = 32
    short, long = longrope_factors(head_dim // 2)
    rope = ({"rope_type": "longrope", "short_factor": short, "long_factor": long,
             "original_max_position_embeddings": 256} if longrope else None)
    config = Phi3Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                        max_position_embeddings=8192,
                        original_max_position_embeddings=256, rope_scaling=rope,
                        bos_token_id=1, eos_token_id=2, pad_token_id=None,
                        tie_word_embeddings=False, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = Phi3ForCausalLM(config).eval()
    sharpen(model, ["qkv_proj"], 4.0)
    model.save_pretrained(out)
    return model


def write_hf_qwen2(tokenizer_dir, out, seed, yarn=True):
    from transformers import Qwen2Config, Qwen2ForCausalLM
    copy_tokenizer(tokenizer_dir, out)
    rope = ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
             "rope_theta": 10000.0} if yarn else {"rope_type": "default", "rope_theta": 10000.0})
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=256, rope_parameters=rope,
                         bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                         rms_norm_eps=1e-6, use_sliding_window=False)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    sharpen(model, ["q_proj", "k_proj"], 4.0)
    model.save_pretrained(out)
    return model


def transformers_agreement(model, reference_path, min_tokens=0, max_tokens=1 << 30):
    """The largest |logit difference| / |logit| between transformers on the HF folder and the
    llama.cpp reference, over its prompts of min_tokens..max_tokens tokens."""
    from safetensors.torch import load_file
    reference = load_file(reference_path)
    worst = 0.0
    for i in range(100):
        if f"input_ids_{i}" not in reference:
            break
        ids = reference[f"input_ids_{i}"]
        if not min_tokens <= len(ids) <= max_tokens:
            continue
        with torch.no_grad():
            logits = model(ids.unsqueeze(0)).logits[0].float()
        theirs = reference[f"logits_{i}"]
        worst = max(worst, float((logits - theirs).abs().max() / theirs.abs().max()))
    return worst


# The quantisations people download for larger models, made by llama.cpp's own quantiser from
# tools/gguf_models.py's F32 files (no importance matrix): Q3_K_M, Q3_K_S, Q3_K_L, Q2_K, IQ4_XS,
# IQ4_NL and IQ3_S, with the K-quants' and Q5/Q6 rows llama.cpp mixes into each; and IQ2_XS, which
# the quantiser makes only with an importance matrix (IMATRIX_TYPES).
LOW_BIT_TYPES = ["q3_k_m", "q3_k_s", "q3_k_l", "q2_k", "iq4_xs", "iq4_nl", "iq3_s"]
IMATRIX_TYPES = ["iq2_xs"]
LOW_BIT_ARCHITECTURES = ["llama", "qwen2", "qwen3", "phi3", "gemma3"]


def quantize_with_imatrix(source, target, kind, text):
    """As users make the 2-bit IQ types: the model runs over `text` (8 chunks of 128 tokens, as
    `llama-imatrix -c 128 --chunks 8`) for each weight's importance matrix, its input
    activations' mean square (gguf_models.importance_matrix, from llama.cpp's own forward pass:
    within 3e-6 of llama-imatrix's file for the tiny llama); llama.cpp's quantiser then weighs each
    block's rounding error by it."""
    from gguf_models import importance_matrix, quantize
    quantize(source, target, kind, importance_matrix(source, text))


def write_low_bit(models, out_dir):
    from gguf_models import PROMPTS as GGUF_PROMPTS, llama_cpp_reference, quantize
    rng = random.Random(63)
    words = ("the model serves tokens quickly and the cache keeps every key and value of each "
             "sequence while the batch grows").split()
    prompts = GGUF_PROMPTS + [" ".join(rng.choice(words) for _ in range(40))]
    for arch in LOW_BIT_ARCHITECTURES:
        source = os.path.join(models, f"gguf_{arch}_f32", "model.gguf")
        if not os.path.exists(source):
            sys.exit(f"{source} is missing: run tools/gguf_models.py --out {models} first")
        for kind in LOW_BIT_TYPES:
            folder = os.path.join(out_dir, f"gguf_{arch}_{kind}")
            os.makedirs(folder, exist_ok=True)
            quantize(source, os.path.join(folder, "model.gguf"), kind)
            llama_cpp_reference(os.path.join(folder, "model.gguf"),
                                os.path.join(folder, "reference.safetensors"), prompts)
        # The calibration text: the prompts' words in a random order, about 2,500 of them.
        calibration = "\n".join(" ".join(rng.choice(words + prompts[0].split()) for _ in range(50))
                                for _ in range(50))
        for kind in IMATRIX_TYPES:
            folder = os.path.join(out_dir, f"gguf_{arch}_{kind}")
            os.makedirs(folder, exist_ok=True)
            quantize_with_imatrix(source, os.path.join(folder, "model.gguf"), kind, calibration)
            llama_cpp_reference(os.path.join(folder, "model.gguf"),
                                os.path.join(folder, "reference.safetensors"), prompts)
    # The gguf package's dequantisation of one tensor of each type, for the C++ dequantisers.
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.torch import save_file
    tensors, where = {}, {}
    for folder in ("gguf_llama_q2_k", "gguf_qwen2_iq4_xs", "gguf_qwen2_iq4_nl", "gguf_qwen3_iq3_s",
                   "gguf_phi3_iq2_xs", "gguf_qwen3moe_mxfp4_moe"):
        path = os.path.join(out_dir, folder, "model.gguf")
        for tensor in GGUFReader(path).tensors:
            kind = tensor.tensor_type.name
            if kind in ("Q2_K", "Q3_K", "IQ4_XS", "IQ4_NL", "IQ3_S", "IQ2_XS", "MXFP4") and \
                    kind not in tensors:
                tensors[kind] = torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())
                where[kind] = f"{folder}/model.gguf:{tensor.name}"
    save_file(tensors, os.path.join(out_dir, "dequantized.safetensors"), where)


# Every family Sluice reads from Hugging Face folders (model_type: llama, mistral, qwen2, qwen3, phi3,
# gemma3_text).
FAMILIES = ["llama", "mistral", "qwen2", "qwen3", "phi3", "gemma3"]


def write_family(models, out_dir, arch, seed):
    """hf_<arch>/: a random model of the family from transformers' own class (gguf_models.py's
    shapes: hidden 256, two layers; gemma3 with a sliding window of 8 on every other layer), as
    save_pretrained writes it, with tiny_llm's tokenizer and transformers' fp32 logits and greedy
    continuations (reference.safetensors, as tools/llm_export.py writes tiny_llm's); and
    hf_<arch>_sharded/, the same saved as a sharded checkpoint."""
    import shutil
    from safetensors.torch import save_file
    from transformers import AutoTokenizer
    from gguf_models import hf_model
    tokenizer_dir = os.path.join(models, "tiny_llm")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    model = hf_model(arch, len(tokenizer), seed)
    reference = transformers_reference(model, tokenizer, seed)
    for name, shard in ((f"hf_{arch}", None), (f"hf_{arch}_sharded", "200KB")):
        folder = os.path.join(out_dir, name)
        if os.path.exists(folder):
            shutil.rmtree(folder)
        model.save_pretrained(folder, **({"max_shard_size": shard} if shard else {}))
        for file in os.listdir(tokenizer_dir):
            if file.startswith("tokenizer") or file == "chat_template.jinja":
                shutil.copy(os.path.join(tokenizer_dir, file), os.path.join(folder, file))
        save_file(reference, os.path.join(folder, "reference.safetensors"))


MOE_FAMILIES = ["qwen3moe", "mixtral", "gpt_oss"]
HARMONY_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>",
                  "<|return|>", "<|call|>"]


def write_moe(models, out_dir, family, seed):
    """hf_<family>/ with transformers' logits (reference.safetensors), and its GGUF files (F32,
    Q4_K_M) with llama.cpp's; returns the largest relative logit difference between transformers
    and llama.cpp on the F32 file."""
    import shutil
    import transformers
    from transformers import AutoTokenizer
    from gguf_models import PROMPTS as GGUF_PROMPTS, llama_cpp_reference, quantize
    import encoder_models
    hf = os.path.join(out_dir, f"hf_{family}")
    if os.path.exists(hf):
        shutil.rmtree(hf)
    copy_tokenizer(os.path.join(models, "tiny_llm"), hf)
    if family == "gpt_oss":  # Harmony's markers, special tokens as in gpt-oss's vocabulary.
        tokenizer = AutoTokenizer.from_pretrained(hf)
        tokenizer.add_special_tokens({"additional_special_tokens": HARMONY_TOKENS})
        tokenizer.save_pretrained(hf)
    common = dict(vocab_size=len(AutoTokenizer.from_pretrained(hf)), hidden_size=256,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=512, rms_norm_eps=1e-5, tie_word_embeddings=False,
                  bos_token_id=1, eos_token_id=2, num_experts_per_tok=2)
    if family == "qwen3moe":
        config = transformers.Qwen3MoeConfig(
            **common, intermediate_size=768, moe_intermediate_size=256, num_experts=8,
            norm_topk_prob=True, head_dim=64, rope_theta=1000000.0)
        model_class, pre_tokenizer = transformers.Qwen3MoeForCausalLM, "qwen2"
    elif family == "gpt_oss":
        # gpt-oss-20b's block in small: its YaRN (factor 32 over 4,096, truncate false), sinks,
        # biases, clamped SwiGLU and alternating windows (8 positions here, so that the prompts
        # pass them); its vocabulary's pre-tokenizer (GPT-4o's) over tiny_llm's vocabulary.
        common["max_position_embeddings"] = 131072
        config = transformers.GptOssConfig(**common, intermediate_size=256, num_local_experts=4,
                                           head_dim=64, sliding_window=8)
        model_class, pre_tokenizer = transformers.GptOssForCausalLM, "gpt-4o"
    else:
        config = transformers.MixtralConfig(**common, intermediate_size=256, num_local_experts=4,
                                            rope_theta=1000000.0, sliding_window=None)
        model_class, pre_tokenizer = transformers.MixtralForCausalLM, "smollm"
    torch.manual_seed(seed)
    model = model_class(config).eval()
    gpt_oss = family == "gpt_oss"
    with torch.no_grad():  # The experts' 3-D weights too; norms away from 1.
        for name, parameter in model.named_parameters():
            if parameter.dim() >= 2:
                # gpt-oss's gates and ups large enough that its SwiGLU's clamp (7) bites.
                parameter.normal_(0, 0.4 if gpt_oss and name.endswith("gate_up_proj") else 0.08)
            elif "norm" in name:
                parameter.uniform_(0.5, 1.5)
            elif gpt_oss and name.endswith("sinks"):  # Near a window's total weight.
                parameter.normal_(2.0, 1.0)
            elif gpt_oss:  # Its biases.
                parameter.normal_(0, 0.5)
    model.save_pretrained(hf)
    from safetensors.torch import save_file
    save_file(transformers_reference(model, AutoTokenizer.from_pretrained(hf), seed),
              os.path.join(hf, "reference.safetensors"))
    rng = random.Random(seed)
    words = ("the model serves tokens quickly and the cache keeps every key and value of each "
             "sequence while the batch grows").split()
    prompts = GGUF_PROMPTS + [" ".join(rng.choice(words) for _ in range(40))]
    f32 = os.path.join(out_dir, f"gguf_{family}_f32", "model.gguf")
    encoder_models.convert_with_pre_tokenizer(hf, f32, pre_tokenizer)
    llama_cpp_reference(f32, os.path.join(os.path.dirname(f32), "reference.safetensors"),
                        prompts, kv_f32=True)
    # MXFP4_MOE: the experts MXFP4, the rest Q8_0 (gpt-oss's released files' types).
    for kind in ("mxfp4_moe",) if family == "gpt_oss" else ("q4_k_m", "mxfp4_moe"):
        quantized = os.path.join(out_dir, f"gguf_{family}_{kind}", "model.gguf")
        os.makedirs(os.path.dirname(quantized), exist_ok=True)
        quantize(f32, quantized, kind)
        llama_cpp_reference(quantized,
                            os.path.join(os.path.dirname(quantized), "reference.safetensors"),
                            prompts, kv_f32=True)
    return transformers_agreement(model, os.path.join(os.path.dirname(f32),
                                                      "reference.safetensors"))


FP4_LEVELS = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # E2M1's magnitudes, codes 0-7.


def mxfp4_blocks(w):
    """w [..., rows, columns] as the released gpt-oss checkpoints store their experts (OCP MX):
    blocks [..., rows, columns / 32, 16] of 4-bit codes (sign bit 3, then E2M1's magnitude
    index; element 2 i in byte i's low nibble, 2 i + 1 in its high one) and scales
    [..., rows, columns / 32] of E8M0 exponents (biased by 127): each block of 32 scaled by
    2^(floor(log2 max |w|) - 2), so its largest lies in [4, 8) and 6 is the largest code."""
    *lead, rows, columns = w.shape
    groups = w.reshape(*lead, rows, columns // 32, 32).float()
    largest = groups.abs().amax(dim=-1)
    exponent = torch.where(largest > 0, torch.floor(torch.log2(largest.clamp_min(2.0 ** -100))) - 2,
                           torch.full_like(largest, -127.0)).clamp(-127, 127)
    scaled = groups / torch.pow(2.0, exponent).unsqueeze(-1)
    levels = torch.tensor(FP4_LEVELS)
    index = (scaled.abs().unsqueeze(-1) - levels).abs().argmin(dim=-1)  # Nearest, ties down.
    codes = (index | ((scaled < 0).to(torch.int64) << 3)).to(torch.uint8)
    blocks = codes[..., 0::2] | (codes[..., 1::2] << 4)
    return blocks.contiguous(), (exponent + 127).to(torch.uint8).contiguous()


def write_gpt_oss_mxfp4(out_dir):
    """hf_gpt_oss_mxfp4/: hf_gpt_oss as openai/gpt-oss-20b is released: the experts' weights MXFP4
    blocks and scales (gate_up_proj_blocks [experts, 2 I, hidden / 32, 16], ...), the rest BF16,
    quantization_config mxfp4; with transformers' logits (its MXFP4 reader, dequantising on the
    CPU) and gguf_gpt_oss_mxfp4_hf/, the file llama.cpp's converter writes from it (the experts'
    blocks moved, not requantised) with llama.cpp's logits."""
    import json
    import shutil
    import transformers
    from transformers import AutoTokenizer
    from safetensors.torch import load_file, save_file
    from gguf_models import PROMPTS as GGUF_PROMPTS, llama_cpp_reference
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors
    source = os.path.join(out_dir, "hf_gpt_oss")
    hf = os.path.join(out_dir, "hf_gpt_oss_mxfp4")
    if os.path.exists(hf):
        shutil.rmtree(hf)
    os.makedirs(hf)
    for name in os.listdir(source):
        if name not in ("model.safetensors", "reference.safetensors", "config.json"):
            shutil.copy(os.path.join(source, name), os.path.join(hf, name))
    tensors = {}
    for name, tensor in load_file(os.path.join(source, "model.safetensors")).items():
        if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
            # [experts, in, out] as x W multiplies them; the blocks run along `in`.
            blocks, scales = mxfp4_blocks(tensor.transpose(1, 2))
            dequantized = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)
            if dequantized.shape != tensor.shape:
                sys.exit(f"{name}: MXFP4 blocks read back as {tuple(dequantized.shape)}")
            tensors[name + "_blocks"], tensors[name + "_scales"] = blocks, scales
        else:
            tensors[name] = tensor.to(torch.bfloat16).contiguous()
    save_file(tensors, os.path.join(hf, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(source, "config.json")) as f:
        config = json.load(f)
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"]}
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    model = transformers.GptOssForCausalLM.from_pretrained(
        hf, dtype=torch.float32,
        quantization_config=transformers.Mxfp4Config(dequantize=True)).eval()
    save_file(transformers_reference(model, AutoTokenizer.from_pretrained(hf), seed=66),
              os.path.join(hf, "reference.safetensors"))
    gguf = os.path.join(out_dir, "gguf_gpt_oss_mxfp4_hf", "model.gguf")
    import encoder_models
    encoder_models.convert_with_pre_tokenizer(hf, gguf, "gpt-4o")
    llama_cpp_reference(gguf, os.path.join(os.path.dirname(gguf), "reference.safetensors"),
                        GGUF_PROMPTS, kv_f32=True)


def transformers_reference(model, tokenizer, seed):
    """transformers' fp32 logits and greedy continuations (24 argmax tokens) of four prompts, as
    reference.safetensors holds them (tools/llm_export.py's layout)."""
    rng = random.Random(seed)
    words = ("the model serves tokens quickly and the cache keeps every key and value of each "
             "sequence while the batch grows").split()
    prompts = ["hello world", "the quick brown fox jumps over the lazy dog 12345",
               "<|im_start|>user\nserving models<|im_end|>\n<|im_start|>assistant\n",
               " ".join(rng.choice(words) for _ in range(60))]
    reference = {}
    with torch.no_grad():
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([tokenizer(prompt)["input_ids"]], dtype=torch.int64)
            reference[f"input_ids_{i}"] = ids[0].contiguous()
            reference[f"logits_{i}"] = model(ids).logits[0].float().contiguous()
            # The argmax at each step, the end-of-sequence token included (generate's
            # min_new_tokens would suppress it).
            tokens = ids
            for _ in range(24):
                next_token = model(tokens).logits[0, -1].argmax()
                tokens = torch.cat([tokens, next_token.view(1, 1)], dim=1)
            reference[f"greedy_{i}"] = tokens[0, ids.shape[1]:].contiguous()
    return reference


def write_sharded(src, out):
    """A Hugging Face folder saved as a sharded checkpoint (model-0000N-of-0000M.safetensors and
    model.safetensors.index.json), as every checkpoint of 7B parameters and more is."""
    from transformers import AutoModelForCausalLM
    import shutil
    if os.path.exists(out):
        shutil.rmtree(out)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.save_pretrained(out, max_shard_size="40KB")
    for name in os.listdir(src):
        # The same weights: transformers' reference logits hold for the sharded copy too.
        if name.startswith("tokenizer") or name in ("chat_template.jinja", "config.yaml",
                                                     "reference.safetensors"):
            shutil.copy(os.path.join(src, name), os.path.join(out, name))
    shards = [n for n in os.listdir(out) if n.endswith(".safetensors")]
    if len(shards) < 2 or not os.path.exists(os.path.join(out, "model.safetensors.index.json")):
        sys.exit(f"{out}: save_pretrained did not shard the checkpoint: {sorted(os.listdir(out))}")


def convert(hf_dir, gguf_path, outtype="f32", extra=(), launcher=(sys.executable,)):
    """llama.cpp's converter, as a user runs it (`launcher`: what runs the script)."""
    os.makedirs(os.path.dirname(gguf_path), exist_ok=True)
    if not os.path.exists(CONVERTER):
        sys.exit(f"{CONVERTER} is missing: run scripts/install-deps.sh")
    result = subprocess.run([*launcher, CONVERTER, hf_dir, "--outfile", gguf_path,
                             "--outtype", outtype, *extra], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"convert_hf_to_gguf.py {hf_dir} failed:\n{result.stderr[-3000:]}")


def hf_cases(folder, texts):
    """tokenizer_cases.jsonl: the tokenizers package's ids for `texts` with the folder's
    tokenizer.json, and its decoding of them."""
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    rows = []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        rows.append((text, ids, tokenizer.decode(ids, skip_special_tokens=False)))
    write_cases(os.path.join(folder, "tokenizer_cases.jsonl"), rows)


def write_hf_tokenizer_variants(hf_dir, sources, texts):
    """The SentencePiece vocabulary's tokenizer.json in the forms checkpoints carry it:
    Metaspace prepending to the input's first segment (transformers' conversion today, hf_dir),
    Metaspace prepending to every segment (hf_spm_always: legacy=True), and Llama 2's and Mistral
    7B's original form, a normalizer that prepends "▁" and replaces spaces (hf_spm_legacy)."""
    import copy
    import shutil
    hf_cases(hf_dir, texts)
    spec = json.load(open(os.path.join(hf_dir, "tokenizer.json")))
    always = copy.deepcopy(spec)
    always["pre_tokenizer"]["prepend_scheme"] = "always"
    legacy = copy.deepcopy(spec)
    legacy["pre_tokenizer"] = None
    legacy["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    for name, variant in (("hf_spm_always", always), ("hf_spm_legacy", legacy)):
        folder = os.path.join(sources, name)
        os.makedirs(folder, exist_ok=True)
        for file in ("tokenizer_config.json", "chat_template.jinja"):
            if os.path.exists(os.path.join(hf_dir, file)):
                shutil.copy(os.path.join(hf_dir, file), os.path.join(folder, file))
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            json.dump(variant, f, ensure_ascii=False)
        hf_cases(folder, texts)


def write_model_only(model_path, sources, texts):
    """Folders with tokenizer.model and no tokenizer.json, as Llama 2-era checkpoints and folders
    saved without the fast tokenizer carry it: tokenizer_config.json in transformers 4's form
    (added_tokens_decoder, add_bos_token, legacy false in hf_spm_model_only, true in
    hf_spm_model_only_legacy), and transformers' ids for the strings from that folder (it converts
    tokenizer.model itself), and its decoding of them."""
    import shutil
    from transformers import AutoTokenizer
    specials = [(0, "<unk>"), (1, "<s>"), (2, "</s>")] + [
        (1000 + i, token) for i, token in enumerate(SPECIAL_TOKENS)]
    for name, legacy in (("hf_spm_model_only", False), ("hf_spm_model_only_legacy", True)):
        folder = os.path.join(sources, name)
        if os.path.exists(folder):
            shutil.rmtree(folder)
        os.makedirs(folder)
        shutil.copy(model_path, os.path.join(folder, "tokenizer.model"))
        config = {"add_bos_token": True, "add_eos_token": False, "legacy": legacy,
                  "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "model_max_length": 4096, "chat_template": CHAT_TEMPLATE,
                  "added_tokens_decoder": {
                      str(i): {"content": token, "lstrip": False, "normalized": False,
                               "rstrip": False, "single_word": False, "special": True}
                      for i, token in specials}}
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=1)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        rows = []
        for text in texts:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            rows.append((text, ids, tokenizer.decode(ids, skip_special_tokens=False)))
        write_cases(os.path.join(folder, "tokenizer_cases.jsonl"), rows)
        for file in os.listdir(folder):  # transformers writes nothing back; keep it so.
            if file not in ("tokenizer.model", "tokenizer_config.json", "tokenizer_cases.jsonl"):
                sys.exit(f"{folder}: unexpected {file}")


def write_cases(path, rows):
    """(text, ids) or (text, ids, decoded) rows: decoded is what the reference makes of the ids
    again, where that is not the text itself."""
    with open(path, "w") as f:
        for row in rows:
            case = {"text": row[0], "ids": row[1]}
            if len(row) > 2 and row[2] != row[0]:
                case["decoded"] = row[2]
            f.write(json.dumps(case, ensure_ascii=False) + "\n")


def detokenize(llm, ids):
    """llama.cpp's own detokenisation (llama_detokenize, special tokens rendered): a SentencePiece
    vocabulary drops the space its tokeniser put in front of the text."""
    import ctypes
    import llama_cpp
    tokens = (llama_cpp.llama_token * len(ids))(*ids)
    size = 16 * len(ids) + 16
    buffer = ctypes.create_string_buffer(size)
    n = llama_cpp.llama_detokenize(llm._model.vocab, tokens, len(ids), buffer, size, False, True)
    assert 0 <= n <= size, n
    return buffer.raw[:n].decode("utf-8", errors="replace")


def spm_strings(strings, rng):
    """The test strings, and the same with special tokens among them (matched as themselves,
    with or without whitespace around them)."""
    out = list(strings[:2000])
    specials = SPECIAL_TOKENS + ["<s>", "</s>", "<unk>"]
    for _ in range(300):
        parts = []
        for _ in range(rng.randint(1, 6)):
            parts.append(rng.choice(strings))
            parts.append(rng.choice(specials) + rng.choice(["", "\n", " ", "  "]))
        out.append("".join(parts))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the test model folder")
    args = parser.parse_args()
    import llama_cpp  # noqa: F401 (fail early when the reference is missing)
    import transformers
    transformers.utils.logging.set_verbosity_error()
    from gguf_models import case_strings, llama_cpp_reference
    start = time.time()
    strings = case_strings(args.out, 10000)
    # Everything in converted/, apart: the test model folder is also a model repository the server
    # tests serve whole, and each of these would load at every server's start.
    out = sources = os.path.join(args.out, "converted")
    os.makedirs(out, exist_ok=True)
    rng = random.Random(61)
    model_path = os.path.join(sources, "spm_tokenizer", "tokenizer.model")
    train_sentencepiece(strings[2000:], model_path)

    hf_dir = os.path.join(sources, "hf_spm_llama")
    tokenizer = write_hf_llama(model_path, hf_dir, seed=61)
    texts = spm_strings(strings, rng)
    write_hf_tokenizer_variants(hf_dir, sources, texts)
    write_model_only(model_path, sources, texts)

    gguf_dir = os.path.join(out, "gguf_spm_llama_f32")
    gguf_path = os.path.join(gguf_dir, "model.gguf")
    convert(hf_dir, gguf_path)
    rows = llama_cpp_cases(gguf_path, texts, os.path.join(gguf_dir, "tokenizer_cases.jsonl"))
    same = sum(row[1] == tokenizer(row[0], add_special_tokens=False).input_ids for row in rows)
    llama_cpp_reference(gguf_path, os.path.join(gguf_dir, "reference.safetensors"), PROMPTS)
    # The same model split in three parts by the converter (as gguf-split splits large models).
    split_dir = os.path.join(out, "gguf_spm_llama_split")
    for old in glob.glob(os.path.join(split_dir, "*.gguf")):
        os.remove(old)
    convert(hf_dir, os.path.join(split_dir, "model.gguf"), extra=("--split-max-tensors", "8"))
    first = os.path.join(split_dir, "model-00001-of-00003.gguf")
    if not os.path.exists(first):
        sys.exit(f"the converter did not write {first}: {os.listdir(split_dir)}")
    llama_cpp_reference(first, os.path.join(split_dir, "reference.safetensors"), PROMPTS)
    print(f"SentencePiece: llama.cpp's ids equal transformers' on {same} of {len(rows)} strings")

    # Prompts past the original 64 positions, and one within them.
    words = ("the model serves tokens quickly and the cache keeps every key and value of each "
             "sequence while the batch grows").split()
    # (15 words are 43 tokens, 60 are 174, 110 are 298: past Phi-3's original 256 positions.)
    prompts = PROMPTS + [" ".join(rng.choice(words) for _ in range(n)) for n in (15, 60)]
    past_original = " ".join(rng.choice(words) for _ in range(110))
    for name, write in (("phi3_longrope", write_hf_phi3), ("qwen2_yarn", write_hf_qwen2)):
        hf = os.path.join(sources, f"hf_{name}")
        model = write(hf_dir, hf, seed=62)
        gguf_dir = os.path.join(out, f"gguf_{name}_f32")
        path = os.path.join(gguf_dir, "model.gguf")
        convert(hf, path)
        llama_cpp_reference(path, os.path.join(gguf_dir, "reference.safetensors"), prompts,
                            kv_f32=True)
        # The same weights with plain RoPE: what a reader that ignores the scaling computes.
        plain = os.path.join(sources, f"hf_{name}_plain")
        write(hf_dir, plain, seed=62, **{"longrope" if "phi3" in name else "yarn": False})
        plain_path = os.path.join(plain, "model.gguf")
        convert(plain, plain_path)
        llama_cpp_reference(plain_path, os.path.join(gguf_dir, "reference_plain_rope.safetensors"),
                            prompts, kv_f32=True)
        if "phi3" in name:
            # A Phi-3's name: llama.cpp drops the whitespace after its special tokens.
            llama_cpp_cases(path, texts, os.path.join(gguf_dir, "tokenizer_cases.jsonl"))
            # llama.cpp takes the long factors when its context is past the original one.
            llama_cpp_reference(path, os.path.join(gguf_dir, "reference_long.safetensors"),
                                prompts + [past_original], n_ctx=512, kv_f32=True)
            short = transformers_agreement(model, os.path.join(gguf_dir, "reference.safetensors"))
            long = transformers_agreement(
                model, os.path.join(gguf_dir, "reference_long.safetensors"), min_tokens=257)
            print(f"{name}: transformers against llama.cpp, max |logit difference| / max |logit|: "
                  f"{short:.1e} within the original context (short factors), {long:.1e} past "
                  f"it (long factors)")
        else:
            print(f"{name}: transformers against llama.cpp, max |logit difference| / max |logit|: "
                  f"{transformers_agreement(model, os.path.join(gguf_dir, 'reference.safetensors')):.1e}")
    for i, family in enumerate(MOE_FAMILIES):
        moe = write_moe(args.out, out, family, seed=64 + i)
        print(f"{family}: transformers against llama.cpp, max |logit difference| / max |logit|: "
              f"{moe:.1e}")
    write_gpt_oss_mxfp4(out)
    # GPT-4o's pre-tokenizer (gpt-oss's files): llama.cpp's ids for the test strings.
    gpt_oss = os.path.join(out, "gguf_gpt_oss_f32")
    llama_cpp_cases(os.path.join(gpt_oss, "model.gguf"), strings[:2300],
                    os.path.join(gpt_oss, "tokenizer_cases.jsonl"))
    write_low_bit(args.out, out)
    write_sharded(os.path.join(args.out, "tiny_llm"), os.path.join(out, "tiny_llm_sharded"))
    for i, arch in enumerate(FAMILIES):
        write_family(args.out, out, arch, seed=70 + i)
    print(f"converted test models in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
