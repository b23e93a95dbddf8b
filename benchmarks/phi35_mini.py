#!/usr/bin/env python3
"""Phi-3.5-mini-instruct, the seeds' language model, end to end in its real shape (random weights;
nothing is downloaded): written as its Hugging Face folder, converted by llama.cpp's own converter,
served by Sluice from both formats, checked against transformers and llama.cpp, and measured
beside llama.cpp at 1 and 16 streams.

  write   OUT/Phi-3.5-mini-instruct/: Phi3ForCausalLM with Phi-3.5-mini-instruct's config.json
          (hidden 3072, 32 layers, 32 heads of 96, FFN 8192, 32,064 embedding rows, 131,072
          positions, LongRoPE's 48 short and 48 long factors over an original 4,096, sliding window
          262,144, untied head), bf16 weights in two shards as the real checkpoint, its chat
          template and special tokens (<|endoftext|> 32000 .. <|user|> 32010, rstrip as the real
          tokenizer.json); the SentencePiece BPE vocabulary is converted/spm_tokenizer's (trained
          here, tools/converted_models.py) grown to 32,000 pieces with pieces merged from its own
          (every id decodes to text of its own), as save_pretrained writes it.
          OUT/gguf_bf16/model.gguf: convert_hf_to_gguf.py --outtype bf16 (the same weights);
          OUT/gguf_q4_k_m/model.gguf: llama.cpp's quantiser from it.
  check   Serves each with `sluice serve` on 127.0.0.1, one at a time (the folder and the BF16 file
          at --llm-precision fp32: the weights exactly, in fp32), and compares: the chat template's
          ids (/tokenize with messages) with transformers' apply_chat_template (the folder) and
          llama.cpp's tokenisation of the same text (the GGUF files); greedy text of
          --check-tokens tokens, the chosen tokens' logprobs and the top-5 logprobs at each step
          with transformers' (fp32 from the bf16 weights, teacher-forced on its own greedy ids) for
          the folder and the BF16 file, with llama.cpp's (llama-cpp-python, the same file) for
          Q4_K_M. Both prompts are served at a context of 8,192 (--context): the chat prompt,
          within the original 4,096, takes LongRoPE's short factors, a prompt past it
          (--long-tokens, default 4,160) the long ones (its first token's logprobs are compared
          too): Sluice and transformers choose by the sequence's length. llama.cpp chooses by its
          n_ctx, so its reference for each prompt runs at the context that gives that prompt's
          factors (4,096 for the chat prompt, 8,192 for the long one).
  rounding  the Q4_K_M file's first-step top-5 logprobs on the chat prompt from Sluice with bf16
          and fp32 KV caches and llama.cpp with f16 and f32 ones, every pair's distance: how far
          rounding alone moves this random model's answer.
  bench   benchmarks/llm_side_by_side.py on the Q4_K_M file (Sluice against llama-server -np 16;
          with --with-hf Sluice on the folder at bf16 too), at 1 and 16 streams (the LitServe
          seed's measure: output tokens/s).

Usage: benchmarks/phi35_mini.py [write] [check] [rounding] [bench] [--out models/phi-3.5-mini]
           [--rounds 2] [--check-tokens 16] [--long-tokens 4160] [--prompts chat,long]
           [--context 8192]
           [--with-hf]
About 20 GB of disk: the folder 7.6 GB, the BF16 file 7.6 GB, Q4_K_M 2.3 GB. `write` takes 5-10
minutes on 2 cores, `check` 10-20 (transformers at fp32 needs 16 GB of memory: the servers are
stopped first), `bench` 10-20 per round.
"""
import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
import urllib.request

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from llm_side_by_side import Server, free_port, post_json, rss_mib  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# Phi-3.5-mini-instruct's config.json, its weights' shape and its RoPE.
LONG_FACTOR = [
    1.0800000429153442, 1.1100000143051147, 1.1399999856948853, 1.340000033378601,
    1.5899999141693115, 1.600000023841858, 1.6200000047683716, 2.620000123977661,
    3.2300000190734863, 3.2300000190734863, 4.789999961853027, 7.400000095367432,
    7.700000286102295, 9.09000015258789, 12.199999809265137, 17.670000076293945,
    24.46000099182129, 28.57000160217285, 30.420001983642578, 30.840002059936523,
    32.590003967285156, 32.93000411987305, 42.320003509521484, 44.96000289916992,
    50.340003967285156, 50.45000457763672, 57.55000305175781, 57.93000411987305,
    58.21000289916992, 60.1400032043457, 62.61000442504883, 62.62000274658203,
    62.71000289916992, 63.1400032043457, 63.1400032043457, 63.77000427246094,
    63.93000411987305, 63.96000289916992, 63.970001220703125, 64.02999877929688,
    64.06999969482422, 64.08000183105469, 64.12000274658203, 64.41000366210938,
    64.4800033569336, 64.51000213623047, 64.52999877929688, 64.83999633789062]
SHORT_FACTOR = [
    1.0, 1.0199999809265137, 1.0299999713897705, 1.0299999713897705, 1.0499999523162842,
    1.0499999523162842, 1.0499999523162842, 1.0499999523162842, 1.0499999523162842,
    1.0699999332427979, 1.0999999046325684, 1.1099998950958252, 1.1599998474121094,
    1.1599998474121094, 1.1699998378753662, 1.2899998426437378, 1.339999794960022,
    1.679999828338623, 1.7899998426437378, 1.8199998140335083, 1.8499997854232788,
    1.8799997568130493, 1.9099997282028198, 1.9399996995925903, 1.9899996519088745,
    2.0199997425079346, 2.0199997425079346, 2.0199997425079346, 2.0199997425079346,
    2.0199997425079346, 2.0199997425079346, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0299997329711914,
    2.0299997329711914, 2.0299997329711914, 2.0299997329711914, 2.0799996852874756,
    2.0899996757507324, 2.189999580383301, 2.2199995517730713, 2.5899994373321533,
    2.729999542236328, 2.749999523162842, 2.8399994373321533]
CONFIG = dict(vocab_size=32064, hidden_size=3072, intermediate_size=8192, num_hidden_layers=32,
              num_attention_heads=32, num_key_value_heads=32, hidden_act="silu",
              max_position_embeddings=131072, original_max_position_embeddings=4096,
              rope_scaling={"type": "longrope", "long_factor": LONG_FACTOR,
                            "short_factor": SHORT_FACTOR},
              rope_theta=10000.0, rms_norm_eps=1e-5, sliding_window=262144,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=32000, pad_token_id=32000,
              attention_bias=False, initializer_range=0.02)
# Phi-3.5-mini-instruct's added tokens, from id 32000; all but <|endoftext|> strip the whitespace
# after them.
ADDED = ["<|endoftext|>", "<|assistant|>", "<|placeholder1|>", "<|placeholder2|>",
         "<|placeholder3|>", "<|placeholder4|>", "<|system|>", "<|end|>", "<|placeholder5|>",
         "<|placeholder6|>", "<|user|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")
PIECES = 32000
MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Can you provide ways to eat combinations of bananas "
                                        "and dragonfruits?"}]


def grown_vocabulary(source, path):
    """source's SentencePiece BPE model grown to PIECES pieces: each new piece the concatenation
    of two pieces already there (so BPE can merge into it), scored below every earlier one."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    proto = model_pb2.ModelProto()
    proto.ParseFromString(open(source, "rb").read())
    normal = [p.piece for p in proto.pieces if p.type == model_pb2.ModelProto.SentencePiece.NORMAL]
    seen = {p.piece for p in proto.pieces}
    score = min(p.score for p in proto.pieces) - 1.0
    rng = random.Random(35)
    while len(proto.pieces) < PIECES:
        left, right = rng.choice(normal), rng.choice(normal)
        piece = left + right.lstrip("\u2581")
        if piece in seen or len(piece) > 16:
            continue
        seen.add(piece)
        normal.append(piece)
        new = proto.pieces.add()
        new.piece, new.score, new.type = piece, score, model_pb2.ModelProto.SentencePiece.NORMAL
        score -= 1e-3
    proto.trainer_spec.vocab_size = PIECES
    with open(path, "wb") as f:
        f.write(proto.SerializeToString())


def write(args):
    from tokenizers import AddedToken
    from transformers import AutoTokenizer, Phi3Config, Phi3ForCausalLM
    folder = os.path.join(args.out, "Phi-3.5-mini-instruct")
    if not os.path.exists(os.path.join(folder, "model.safetensors.index.json")):
        source = os.path.join(args.test_models, "converted", "spm_tokenizer", "tokenizer.model")
        if not os.path.exists(source):
            sys.exit(f"{source} is missing: make models writes it")
        staging = folder + ".partial"
        shutil.rmtree(staging, ignore_errors=True)
        os.makedirs(staging)
        start = time.time()
        grown_vocabulary(source, os.path.join(staging, "tokenizer.model"))
        with open(os.path.join(staging, "tokenizer_config.json"), "w") as f:
            json.dump({"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>",
                       "eos_token": "<|endoftext|>", "unk_token": "<unk>",
                       "pad_token": "<|endoftext|>", "add_bos_token": False,
                       "add_eos_token": False, "legacy": False, "model_max_length": 131072,
                       "chat_template": CHAT_TEMPLATE}, f)
        tokenizer = AutoTokenizer.from_pretrained(staging)
        tokenizer.add_tokens([AddedToken(t, rstrip=t != "<|endoftext|>", lstrip=False,
                                         normalized=False, special=True) for t in ADDED],
                             special_tokens=True)
        if tokenizer.convert_tokens_to_ids("<|user|>") != 32010:
            sys.exit(f"<|user|> is {tokenizer.convert_tokens_to_ids('<|user|>')}, not 32010")
        tokenizer.save_pretrained(staging)
        torch.manual_seed(35)
        torch.set_default_dtype(torch.bfloat16)  # 3.8B parameters: fp32 would need 15 GB more.
        try:
            model = Phi3ForCausalLM(Phi3Config(**CONFIG)).eval()
        finally:
            torch.set_default_dtype(torch.float32)
        model.generation_config.eos_token_id = [32007, 32001, 32000]
        model.save_pretrained(staging, max_shard_size="5GB")
        del model
        os.replace(staging, folder)
        print(f"{folder}: written in {time.time() - start:.0f} s", flush=True)
    bf16 = os.path.join(args.out, "gguf_bf16", "model.gguf")
    if not os.path.exists(bf16):
        from converted_models import convert
        start = time.time()
        convert(folder, bf16 + ".partial", outtype="bf16")
        os.replace(bf16 + ".partial", bf16)
        print(f"{bf16}: converted in {time.time() - start:.0f} s", flush=True)
    q4 = os.path.join(args.out, "gguf_q4_k_m", "model.gguf")
    if not os.path.exists(q4):
        from gguf_models import quantize
        start = time.time()
        os.makedirs(os.path.dirname(q4), exist_ok=True)
        quantize(bf16, q4 + ".partial", "q4_k_m")
        os.replace(q4 + ".partial", q4)
        print(f"{q4}: quantised in {time.time() - start:.0f} s", flush=True)


class Sluice(Server):
    """`sluice serve PATH` on 127.0.0.1 (its log in OUT/LOG_NAME.log) and the model's name."""

    def __init__(self, args, path, precision=None, log_name="sluice", context=8192, extra=()):
        port = free_port()
        command = [args.sluice, "serve", path, "--port", str(port),
                   "--llm-prefix-caching", "off", "--llm-context-length", str(context)]
        if precision:
            command += ["--llm-precision", precision]
        command += list(extra)
        self.log = open(os.path.join(args.out, f"{log_name}.log"), "w")
        start = time.time()
        super().__init__(f"sluice {path}", command, "/v2/health/ready", port, self.log,
                         timeout=900)
        self.ready_s = time.time() - start
        self.model = json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{self.port}/v1/models").read())["data"][0]["id"]

    def stop(self):
        super().stop()
        self.log.close()


def sluice_greedy(server, ids, tokens):
    """Sluice's greedy continuation of `ids`: its tokens (as text), the chosen tokens' logprobs
    and each step's top-5 logprobs (sorted)."""
    reply = post_json(server.port, "/v1/completions",
                      {"model": server.model, "prompt": ids, "max_tokens": tokens,
                       "temperature": 0, "logprobs": 5, "ignore_eos": True})
    logprobs = reply["choices"][0]["logprobs"]
    top = [sorted(step.values(), reverse=True) for step in logprobs["top_logprobs"]]
    return logprobs["tokens"], logprobs["token_logprobs"], top


def long_prompt(count):
    rng = random.Random(4160)
    return [rng.randrange(3, PIECES) for _ in range(count)]


def compare(name, ours, theirs, rows):
    """Greedy agreement (the leading steps whose tokens are the same) and, over those steps, the
    largest difference of the chosen token's logprob and of the top-5 logprobs."""
    tokens, chosen, top = ours
    their_tokens, their_chosen, their_top = theirs
    agree = 0
    while agree < min(len(tokens), len(their_tokens)) and tokens[agree] == their_tokens[agree]:
        agree += 1
    steps = range(max(agree, 1))  # The first step's logprobs compare even when its tokens differ.
    row = {"check": name, "greedy_agree": f"{agree}/{len(their_tokens)}",
           "max_delta_chosen": max(abs(chosen[i] - their_chosen[i]) for i in steps)
           if agree else None,
           "max_delta_top5": max(max(abs(a - b) for a, b in zip(top[i], their_top[i]))
                                 for i in steps)}
    rows.append(row)
    print(json.dumps(row), flush=True)


def transformers_reference(folder, prompts):
    """transformers' greedy continuations of each prompt (fp32 from the bf16 weights): its tokens
    (as text), the chosen tokens' logprobs and each step's top-5."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    results = []
    with torch.no_grad():
        for ids, count in prompts:
            out = model.generate(torch.tensor([ids]), max_new_tokens=count, min_new_tokens=count,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=32000)
            new = out.sequences[0][len(ids):].tolist()
            chosen, top = [], []
            for step, token in zip(out.logits, new):
                logprobs = torch.log_softmax(step[0].float(), dim=-1)
                chosen.append(float(logprobs[token]))
                top.append(logprobs.topk(5).values.tolist())
            # Each token's own text, as Sluice's logprobs name it: "▁" as a space (the
            # tokenizer's decoder would drop a leading one), a byte piece as its byte.
            texts = [bytes([int(t[3:5], 16)]).decode("latin-1")
                     if len(t) == 6 and t.startswith("<0x") else t.replace("\u2581", " ")
                     for t in tokenizer.convert_ids_to_tokens(new)]
            results.append((texts, chosen, top))
    del model
    return results


def llama_cpp_reference(path, prompts):
    """llama.cpp's greedy tokens and logprobs for each (ids, count), each prompt at the context
    that gives it transformers' LongRoPE factors (llama.cpp chooses them by n_ctx)."""
    import llama_cpp
    results = []
    for ids, count in prompts:
        n_ctx = 4096 if len(ids) + count <= 4096 else 8192
        llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=512, logits_all=True,
                              n_threads=os.cpu_count(), verbose=False)
        out = llm.create_completion(ids, max_tokens=count, temperature=0.0, logprobs=5,
                                    top_k=1)
        logprobs = out["choices"][0]["logprobs"]
        top = [sorted((float(v) for v in step.values()), reverse=True)
               for step in logprobs["top_logprobs"]]
        results.append((logprobs["tokens"], [float(v) for v in logprobs["token_logprobs"]], top))
        del llm
    return results


def check(args):
    from transformers import AutoTokenizer
    folder = os.path.join(args.out, "Phi-3.5-mini-instruct")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat_ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if hasattr(chat_ids, "keys"):  # transformers 5 answers a BatchEncoding.
        chat_ids = chat_ids["input_ids"]
    # llama.cpp's ids for the same text from the GGUF file: its converter keeps no rstrip for the
    # added tokens, and llama.cpp restores it only for a general.name with "phi-3" or "phi3" in it.
    import llama_cpp
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    vocab = llama_cpp.Llama(model_path=os.path.join(args.out, "gguf_q4_k_m", "model.gguf"),
                            vocab_only=True, verbose=False)
    llama_ids = vocab.tokenize(text.encode(), add_bos=False, special=True)
    del vocab
    # Both at one served context: LongRoPE's factors follow each prompt's length.
    kinds = {"chat": (list(chat_ids), args.check_tokens, args.context),
             "long": (long_prompt(args.long_tokens), 1, args.context)}
    wanted = args.prompts.split(",")
    prompts = [kinds[k][:2] for k in wanted]
    rows, ours = [], {}

    def template_row(server, name):
        rendered = post_json(server.port, "/tokenize",
                             {"model": server.model, "messages": MESSAGES})["tokens"]
        reference, label = ((list(chat_ids), "transformers") if name == "hf"
                            else (llama_ids, "llama.cpp"))
        row = {"check": f"{name} chat template against {label}",
               "ids_equal": rendered == reference, "ours": len(rendered),
               "transformers": len(chat_ids), "llama.cpp": len(llama_ids),
               "ready_s": round(server.ready_s, 1),
               "rss_mib": round(rss_mib(server.process.pid))}
        rows.append(row)
        print(json.dumps(row), flush=True)

    for name, path, precision in (
            ("hf", folder, "fp32"),
            ("gguf_bf16", os.path.join(args.out, "gguf_bf16", "model.gguf"), "fp32"),
            ("gguf_q4_k_m", os.path.join(args.out, "gguf_q4_k_m", "model.gguf"), None)):
        ours[name] = []
        for kind in wanted:
            ids, count, context = kinds[kind]
            server = Sluice(args, path, precision, f"check_{name}_{kind}", context)
            try:
                if kind == wanted[0]:
                    template_row(server, name)
                ours[name].append(sluice_greedy(server, ids, count))
            finally:
                server.stop()
    reference = transformers_reference(folder, prompts)
    llama = llama_cpp_reference(os.path.join(args.out, "gguf_q4_k_m", "model.gguf"), prompts)
    for name, theirs, label in (("hf", reference, "transformers"),
                                ("gguf_bf16", reference, "transformers"),
                                ("gguf_q4_k_m", llama, "llama.cpp")):
        for i, kind in enumerate(wanted):
            what = "chat prompt" if kind == "chat" else f"{args.long_tokens}-token prompt"
            compare(f"{name} vs {label}, {what}", ours[name][i], theirs[i], rows)
    with open(os.path.join(args.out, "check.json"), "w") as f:
        json.dump(rows, f, indent=1)


def rounding(args):
    """How far rounding alone moves the Q4_K_M file's answer on the chat prompt: Sluice with its
    bf16 and fp32 KV caches, llama.cpp with its f16 and f32 ones; the first step's top-5 logprobs
    of every pair."""
    import llama_cpp
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(os.path.join(args.out, "Phi-3.5-mini-instruct"))
    ids = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    path = os.path.join(args.out, "gguf_q4_k_m", "model.gguf")
    runs = {}
    for kv in ("bf16", "fp32"):
        server = Sluice(args, path, log_name=f"rounding_{kv}", context=4096,
                        extra=["--llm-kv-cache-dtype", kv])
        try:
            runs[f"sluice kv {kv}"] = sluice_greedy(server, ids, 1)[2][0]
        finally:
            server.stop()
    for kv, types in (("f16", {}), ("f32", {"type_k": 0, "type_v": 0})):  # 0: GGML_TYPE_F32.
        llm = llama_cpp.Llama(model_path=path, n_ctx=4096, logits_all=True,
                              n_threads=os.cpu_count(), verbose=False, **types)
        out = llm.create_completion(ids, max_tokens=1, temperature=0.0, logprobs=5, top_k=1)
        runs[f"llama.cpp kv {kv}"] = sorted(
            (float(v) for v in out["choices"][0]["logprobs"]["top_logprobs"][0].values()),
            reverse=True)
        del llm
    names = list(runs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            delta = max(abs(x - y) for x, y in zip(runs[a], runs[b]))
            print(f"{a} / {b}: max |top-5 logprob difference| {delta:.2f}", flush=True)


def bench(args):
    folder = os.path.join(args.out, "Phi-3.5-mini-instruct")
    q4 = os.path.join(args.out, "gguf_q4_k_m")
    subprocess.run([os.path.join(ROOT, "benchmarks", "build_llama_cpp.sh")], check=True)
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "llm_side_by_side.py"),
               "--sluice", args.sluice, "--model", f"phi35-q4_k_m={q4}",
               "--gguf", os.path.join(q4, "model.gguf"), "--rounds", str(args.rounds),
               "--concurrency", "1,16", "--out", os.path.join(args.out, "side_by_side.csv")]
    if args.with_hf:
        command += ["--model", f"phi35-hf-bf16={folder}@bf16"]
    subprocess.run(command, check=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="*", default=["write", "check", "bench"])
    parser.add_argument("--out", default="models/phi-3.5-mini")
    parser.add_argument("--test-models", default="build/test-models")
    parser.add_argument("--sluice", default="build/sluice")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--check-tokens", type=int, default=16)
    parser.add_argument("--long-tokens", type=int, default=4160)
    parser.add_argument("--context", type=int, default=8192,
                        help="check: the context both prompts are served at")
    parser.add_argument("--prompts", default="chat,long",
                        help="check: the chat prompt, the long one past the original context")
    parser.add_argument("--with-hf", action="store_true",
                        help="bench: the folder at bf16 too (7.6 GB a token: slow)")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for step in args.steps:
        {"write": write, "check": check, "bench": bench, "rounding": rounding}[step](args)


if __name__ == "__main__":
    main()
