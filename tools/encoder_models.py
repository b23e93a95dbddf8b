#!/usr/bin/env python3
"""Writes encoder test models (BERT-family embedding models and cross-encoder rerankers) as users
get them: a WordPiece vocabulary trained here with the tokenizers package, tiny random BertModels
wrapped and saved by sentence-transformers (modules.json, the pooling module's config, Normalize),
a BertForSequenceClassification saved by transformers' save_pretrained, and their GGUF files from
llama.cpp's own converter (convert_hf_to_gguf.py, .deps/llama.cpp).

Everything goes to encoders/ (the test model folder is also a model repository served whole):
  hf_bert_mean/        mean pooling, then Normalize (all-MiniLM's and e5's modules), uncased
  hf_bert_cls/         CLS pooling without Normalize (bge's pooling; its normalising is left to
                       the caller), a cased vocabulary
  hf_bert_rerank/      a cross-encoder: BertForSequenceClassification with one label
  gguf_bert_mean_f32/, gguf_bert_cls_f32/, gguf_bert_rerank_f32/
                       those folders through llama.cpp's converter, F32
  hf_xlmr_mean/, hf_xlmr_rerank/, gguf_xlmr_*_f32/
                       XLM-RoBERTa's (a SentencePiece Unigram vocabulary), the same way
  hf_roberta_mean/, hf_roberta_rerank/, gguf_roberta_*_f32/
                       RoBERTa's (all-distilroberta's, stsb-roberta's shape): a byte-level BPE
                       vocabulary trained here, RobertaProcessing's <s> A </s></s> B </s>
  hf_distilbert_mean/, gguf_distilbert_mean_f32/, hf_distilbert_rerank/
                       DistilBERT's (msmarco-distilbert's shape; its own tensor names, no token
                       types); the reranker's head is pre_classifier + ReLU, which llama.cpp runs
                       with tanh, so it has no GGUF file here
  hf_xlmr_model_only/  hf_xlmr_mean without tokenizer.json (sentencepiece.bpe.model alone, the
                       tokenizer_config.json of xlm-roberta-base's repository), its references
                       from sentence-transformers and transformers, which convert that file
  hf_nomic_mean/, hf_nomic_hub/, gguf_nomic_mean_f32/
                       a nomic-bert (rotary, SwiGLU) from transformers' NomicBertModel, as
                       transformers saves it and with the config.json of nomic's repositories,
                       and that one's GGUF (reference_llama_cpp.json: llama.cpp's embeddings)
Each holds reference.json: the texts, sentence-transformers' embeddings of them (or, for the
reranker, a query, documents, CrossEncoder.predict's scores, the raw logits, and the logits
without BERT's pooler, which llama.cpp's converter leaves out of its files), and
tokenizer_cases.jsonl: the tokenizers package's ids for the strings (HF folders) or llama.cpp's
(GGUF files), with the special tokens the model adds.

Usage: tools/encoder_models.py --out build/test-models
(after tools/llm_export.py --test, whose tokenizer strings it trains and tests on)
"""
import argparse
import json
import os
import random
import sys
import time

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONVERTER = os.path.join(ROOT, ".deps", "llama.cpp", "convert_hf_to_gguf.py")
TEXTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Sluice serves embeddings for retrieval-augmented generation, in batches.",
    "Ünïcödé àccents, CJK 中文字符 and punctuation!?",
    "a",
    "model serving: latency, throughput & cost (p99 < 50 ms)",
]
QUERY = "how fast does the server answer?"
DOCUMENTS = [
    "The server answers in under ten milliseconds at the median.",
    "Bananas are rich in potassium.",
    "Throughput grows with the batch size until the memory bandwidth is spent.",
    "how fast does the server answer?",
]


def case_strings(out_dir):
    path = os.path.join(out_dir, "smollm2_tokenizer", "tokenizer_cases.jsonl")
    if not os.path.exists(path):
        sys.exit(f"{path} is missing: run tools/llm_export.py --test --out {out_dir} first")
    with open(path) as f:
        return [json.loads(line)["text"] for line in f]


def train_wordpiece(strings, lowercase, folder, distilbert=False):
    """A WordPiece vocabulary as BERT's (BertNormalizer, BertPreTokenizer, '##' continuations,
    [CLS] ... [SEP] added), saved by transformers' BertTokenizerFast (DistilBertTokenizerFast: the
    same without token types)."""
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast, DistilBertTokenizerFast
    tokenizer = BertWordPieceTokenizer(lowercase=lowercase, strip_accents=None,
                                       clean_text=True, handle_chinese_chars=True)
    tokenizer.train_from_iterator(strings, vocab_size=1500, min_frequency=2,
                                  special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    os.makedirs(folder, exist_ok=True)
    raw = os.path.join(folder, "tokenizer.json")
    tokenizer.save(raw)
    cls = DistilBertTokenizerFast if distilbert else BertTokenizerFast
    fast = cls(tokenizer_file=raw, do_lower_case=lowercase, model_max_length=128)
    fast.save_pretrained(folder)
    return fast


def train_unigram(strings, folder):
    """A SentencePiece Unigram vocabulary (SentencePiece's default NFKC character map) as
    XLM-RoBERTa's repositories carry it (sentencepiece.bpe.model), and the tokenizer.json
    transformers converts it to (Precompiled, WhitespaceSplit + Metaspace, <s> A </s></s> B </s>)."""
    import io
    import sentencepiece
    from transformers import AutoTokenizer
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(strings), model_writer=model, vocab_size=4000, model_type="unigram",
        character_coverage=0.98, hard_vocab_limit=False, num_threads=2, minloglevel=2,
        max_sentence_length=100000)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "sentencepiece.bpe.model"), "wb") as f:
        f.write(model.getvalue())
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "XLMRobertaTokenizer", "model_max_length": 128}, f)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump({"model_type": "xlm-roberta"}, f)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return tokenizer


def write_xlmr_model_only(src, folder, texts):
    """`src`, an XLM-RoBERTa embedder's folder, without tokenizer.json: its
    sentencepiece.bpe.model alone with the tokenizer_config.json of xlm-roberta-base's repository
    (transformers 4's form: added_tokens_decoder, <mask> stripping the space before it), as
    folders saved with the slow tokenizer carry it; sentence-transformers' embeddings and
    transformers' ids from it (both convert the SentencePiece file)."""
    import shutil
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(src, folder)
    os.remove(os.path.join(folder, "tokenizer.json"))
    mask_id = len(AutoTokenizer.from_pretrained(src)) - 1

    def token(content, lstrip=False):
        return {"content": content, "lstrip": lstrip, "normalized": False, "rstrip": False,
                "single_word": False, "special": True}
    config = {
        "added_tokens_decoder": {"0": token("<s>"), "1": token("<pad>"), "2": token("</s>"),
                                 "3": token("<unk>"), str(mask_id): token("<mask>", True)},
        "bos_token": "<s>", "clean_up_tokenization_spaces": True, "cls_token": "<s>",
        "eos_token": "</s>", "mask_token": "<mask>", "model_max_length": 128,
        "pad_token": "<pad>", "sep_token": "</s>", "tokenizer_class": "XLMRobertaTokenizer",
        "unk_token": "<unk>"}
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert not os.path.exists(os.path.join(folder, "tokenizer.json"))
    write_cases(os.path.join(folder, "tokenizer_cases.jsonl"),
                texts + ["fill the <mask> here", "<s>two</s> <unk> <pad>"],
                lambda t: tokenizer(t).input_ids)
    model = SentenceTransformer(folder, device="cpu")
    vectors = model.encode(TEXTS, convert_to_numpy=True, batch_size=4)
    with open(os.path.join(folder, "reference.json"), "w") as f:
        json.dump({"texts": TEXTS, "embeddings": vectors.tolist()}, f)


def train_bytelevel_bpe(strings, folder):
    """A byte-level BPE vocabulary as RoBERTa's (GPT-2's bytes, no prefix space, <s> A </s> and
    <s> A </s></s> B </s> from RobertaProcessing), saved by transformers' RobertaTokenizer."""
    from tokenizers import ByteLevelBPETokenizer
    from tokenizers.processors import RobertaProcessing
    from transformers import AutoTokenizer, RobertaTokenizerFast
    tokenizer = ByteLevelBPETokenizer()
    tokenizer.train_from_iterator(strings, vocab_size=2000, min_frequency=2,
                                  special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    tokenizer.post_processor = RobertaProcessing(("</s>", tokenizer.token_to_id("</s>")),
                                                 ("<s>", tokenizer.token_to_id("<s>")))
    os.makedirs(folder, exist_ok=True)
    raw = os.path.join(folder, "tokenizer.json")
    tokenizer.save(raw)
    RobertaTokenizerFast(tokenizer_file=raw, model_max_length=128).save_pretrained(folder)
    return AutoTokenizer.from_pretrained(folder)


def roberta_config(vocab, xlmr=False, **extra):
    """RoBERTa's (or XLM-RoBERTa's) config: positions start after the padding index (1), so 128
    positions take 130 rows; one token type, as roberta-base's and xlm-roberta-base's."""
    from transformers import RobertaConfig, XLMRobertaConfig
    return (XLMRobertaConfig if xlmr else RobertaConfig)(
        vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=128, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, initializer_range=0.2, **extra)


def distilbert_config(vocab, **extra):
    from transformers import DistilBertConfig
    return DistilBertConfig(vocab_size=vocab, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                            max_position_embeddings=128, initializer_range=0.2, **extra)


def xlmr_config(vocab, **extra):
    return roberta_config(vocab, xlmr=True, **extra)


def bert_config(vocab, **extra):
    from transformers import BertConfig
    # Weights larger than BERT's initialisation, so that texts get distinct vectors.
    return BertConfig(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=128, type_vocab_size=2,
                      initializer_range=0.2, **extra)


def base_model(family, vocab):
    """A random base model of `family` (bert, xlmr, roberta, distilbert), without a pooler."""
    import transformers
    if family == "distilbert":
        return transformers.DistilBertModel(distilbert_config(vocab)).eval()
    classes = {"bert": (transformers.BertModel, bert_config),
               "xlmr": (transformers.XLMRobertaModel, xlmr_config),
               "roberta": (transformers.RobertaModel, roberta_config)}
    cls, config = classes[family]
    return cls(config(vocab), add_pooling_layer=False).eval()


def classifier_model(family, vocab):
    """A random ...ForSequenceClassification of `family` with one label (a cross-encoder)."""
    import transformers
    classes = {"bert": (transformers.BertForSequenceClassification, bert_config),
               "xlmr": (transformers.XLMRobertaForSequenceClassification, xlmr_config),
               "roberta": (transformers.RobertaForSequenceClassification, roberta_config),
               "distilbert": (transformers.DistilBertForSequenceClassification,
                              distilbert_config)}
    cls, config = classes[family]
    return cls(config(vocab, num_labels=1)).eval()


def write_embedder(tokenizer, folder, pooling, normalize, seed, family="bert"):
    """A random BertModel (or XLMRobertaModel, RobertaModel, DistilBertModel) behind
    sentence-transformers' modules, saved by SentenceTransformer."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    torch.manual_seed(seed)
    bert = base_model(family, len(tokenizer))
    bert.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformer = Transformer(folder, max_seq_length=128)
    modules = [transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode=pooling)]
    if normalize:
        modules.append(Normalize())
    model = SentenceTransformer(modules=modules, device="cpu")
    model.save(folder)
    model = SentenceTransformer(folder, device="cpu")  # As users load it.
    vectors = model.encode(TEXTS, convert_to_numpy=True, batch_size=4)
    return {"texts": TEXTS, "embeddings": vectors.tolist()}


def write_reranker(tokenizer, folder, seed, family="bert"):
    """A random BertForSequenceClassification (or XLMRobertaForSequenceClassification, bge-reranker's
    class; RobertaFor..., DistilBertFor...) with one label (a cross-encoder), as save_pretrained
    writes it, scored by sentence-transformers' CrossEncoder."""
    from sentence_transformers import CrossEncoder
    torch.manual_seed(seed)
    model = classifier_model(family, len(tokenizer))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    encoder = CrossEncoder(folder, device="cpu")
    pairs = [(QUERY, d) for d in DOCUMENTS]
    scores = encoder.predict(pairs, convert_to_numpy=True)
    with torch.no_grad():
        batch = tokenizer([QUERY] * len(DOCUMENTS), DOCUMENTS, padding=True, return_tensors="pt")
        logits = model(**batch).logits[:, 0]
        reference = {"query": QUERY, "documents": DOCUMENTS, "scores": scores.tolist(),
                     "logits": logits.tolist()}
        if family == "bert":
            # llama.cpp's converter leaves BERT's pooler (dense + tanh) out of the GGUF file: what
            # the classifier gives on the first token's state without it.
            states = model.bert(**batch).last_hidden_state[:, 0]
            reference["logits_without_pooler"] = model.classifier(states)[:, 0].tolist()
    return reference


# llama.cpp's converter names a vocabulary's pre-tokenizer by hashing the ids of a check string
# against those of the models it knows, and stops at one it does not know, as a vocabulary
# trained here is: it is named "default" instead (llama.cpp's WordPiece tokenizer, which BERT
# files get, does not read the name). The converter is otherwise run as a user runs it.
RUN_CONVERTER = """
import runpy, sys
sys.path.insert(0, sys.argv[1])
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "default"
script = sys.argv[2]
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def write_nomic(tokenizer, folder, hub_folder, seed):
    """A random nomic-bert (nomic-embed-text-v1.5's block: rotary positions, fused qkv, SwiGLU,
    no biases, post-norms) from transformers' own NomicBertModel behind sentence-transformers'
    modules (mean, Normalize), saved by SentenceTransformer (transformers 5 writes the hub's
    tensor names: Wqkv, fc11, fc12, fc2, norm1, norm2); and the same weights with the config.json
    nomic's repositories carry (n_embd, n_layer, rotary_emb_base, ...: what llama.cpp's converter
    reads), in `hub_folder`. Returns sentence-transformers' embeddings of TEXTS."""
    import shutil
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules.normalize import Normalize
    from sentence_transformers.base.modules.transformer import Transformer
    from sentence_transformers.sentence_transformer.modules.pooling import Pooling
    from transformers import NomicBertConfig, NomicBertModel
    torch.manual_seed(seed)
    hidden, layers, heads, inner = 64, 2, 4, 128
    config = NomicBertConfig(vocab_size=len(tokenizer), hidden_size=hidden,
                             num_hidden_layers=layers, num_attention_heads=heads,
                             intermediate_size=inner, max_position_embeddings=2048,
                             initializer_range=0.2)
    NomicBertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    transformer = Transformer(folder, max_seq_length=128)
    model = SentenceTransformer(
        modules=[transformer, Pooling(hidden, pooling_mode="mean"), Normalize()], device="cpu")
    model.save(folder)
    model = SentenceTransformer(folder, device="cpu")
    vectors = model.encode(TEXTS, convert_to_numpy=True, batch_size=4)
    shutil.rmtree(hub_folder, ignore_errors=True)
    shutil.copytree(folder, hub_folder)
    hub = {"architectures": ["NomicBertModel"], "model_type": "nomic_bert",
           "vocab_size": len(tokenizer), "n_embd": hidden, "n_layer": layers, "n_head": heads,
           "n_inner": inner, "n_positions": 8192, "max_trained_positions": 2048,
           "rotary_emb_base": 1000, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
           "rotary_emb_scale_base": None, "qkv_proj_bias": False, "mlp_fc1_bias": False,
           "mlp_fc2_bias": False, "type_vocab_size": 2, "layer_norm_epsilon": 1e-12,
           "activation_function": "swiglu", "prenorm": False, "causal": False,
           "pad_token_id": 0}
    # llama.cpp's converter reads config.json through transformers 5, whose NomicBertConfig takes
    # hidden_size & co. (its defaults are nomic-embed-text-v1.5's sizes, so the real files convert)
    # and ignores n_embd & co.: this small model states both.
    hub.update(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
               intermediate_size=inner, max_position_embeddings=2048)
    with open(os.path.join(hub_folder, "config.json"), "w") as f:
        json.dump(hub, f, indent=2)
    return {"texts": TEXTS, "embeddings": vectors.tolist()}


def llama_cpp_embeddings(path, tokenizer, texts):
    """llama.cpp's mean-pooled, normalised embeddings of `texts` (those its WordPiece splits as
    the tokenizers package does, so that both see the same tokens)."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, embedding=True, n_ctx=512, n_batch=512,
                          n_ubatch=512, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
                          verbose=False)
    kept = [t for t in texts if llm.tokenize(t.encode(), add_bos=True, special=False) ==
            tokenizer(t).input_ids]
    vectors = []
    for text in kept:
        v = torch.tensor(llm.embed(text), dtype=torch.float64)
        vectors.append((v / v.norm()).tolist())
    del llm
    return {"texts": kept, "embeddings": vectors}


def convert(hf_dir, gguf_path, outtype="f32"):
    """llama.cpp's converter on `hf_dir`, its pre-tokenizer check answered (RUN_CONVERTER)."""
    convert_with_pre_tokenizer(hf_dir, gguf_path, "default", outtype)


def convert_with_pre_tokenizer(hf_dir, gguf_path, pre_tokenizer, outtype="f32"):
    """llama.cpp's converter on `hf_dir`, its check of the vocabulary's pre-tokenizer answered
    `pre_tokenizer` (the test vocabularies are not among those it knows by their hashes)."""
    import converted_models
    run = RUN_CONVERTER.replace('"default"', repr(pre_tokenizer))
    converted_models.convert(hf_dir, gguf_path, outtype, launcher=(
        sys.executable, "-c", run, os.path.dirname(CONVERTER)))


def write_cases(path, texts, encode):
    with open(path, "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text, "ids": encode(text)}, ensure_ascii=False) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the test model folder")
    args = parser.parse_args()
    import llama_cpp
    import transformers
    transformers.utils.logging.set_verbosity_error()
    start = time.time()
    strings = case_strings(args.out)
    rng = random.Random(61)
    texts = rng.sample(strings, 1500) + TEXTS
    out = os.path.join(args.out, "encoders")

    def embedder(name, tokenizer, reference, pre_tokenizer="default"):
        """hf_<name>/ and gguf_<name>_f32/: the reference and tokenizer cases beside each (the
        tokenizers package's and llama.cpp's ids)."""
        folder = os.path.join(out, f"hf_{name}")
        gguf_dir = os.path.join(out, f"gguf_{name}_f32")
        path = os.path.join(gguf_dir, "model.gguf")
        convert_with_pre_tokenizer(folder, path, pre_tokenizer)
        for where in (folder, gguf_dir):
            with open(os.path.join(where, "reference.json"), "w") as f:
                json.dump(reference, f)
        write_cases(os.path.join(folder, "tokenizer_cases.jsonl"), texts,
                    lambda t: tokenizer(t).input_ids)
        llm = llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)
        write_cases(os.path.join(gguf_dir, "tokenizer_cases.jsonl"), texts,
                    lambda t: llm.tokenize(t.encode(), add_bos=True, special=False))
        del llm

    def reranker(name, reference, gguf=True, pre_tokenizer="default"):
        folder, gguf_dir = os.path.join(out, f"hf_{name}"), os.path.join(out, f"gguf_{name}_f32")
        if gguf:
            convert_with_pre_tokenizer(folder, os.path.join(gguf_dir, "model.gguf"), pre_tokenizer)
        for where in (folder, gguf_dir) if gguf else (folder,):
            with open(os.path.join(where, "reference.json"), "w") as f:
                json.dump(reference, f)

    for name, pooling, normalize, lowercase in (("mean", "mean", True, True),
                                                ("cls", "cls", False, False)):
        folder = os.path.join(out, f"hf_bert_{name}")
        tokenizer = train_wordpiece(strings[:3000], lowercase, folder)
        embedder(f"bert_{name}", tokenizer,
                 write_embedder(tokenizer, folder, pooling, normalize, seed=90))
    folder = os.path.join(out, "hf_bert_rerank")
    tokenizer = train_wordpiece(strings[:3000], True, folder)
    reranker("bert_rerank", write_reranker(tokenizer, folder, seed=91))

    # XLM-RoBERTa (multilingual-e5's and bge-m3's shape; bge-reranker-v2-m3's head), a Unigram
    # vocabulary.
    folder = os.path.join(out, "hf_xlmr_mean")
    tokenizer = train_unigram(strings, folder)
    embedder("xlmr_mean", tokenizer,
             write_embedder(tokenizer, folder, "mean", True, seed=92, family="xlmr"))
    write_xlmr_model_only(folder, os.path.join(out, "hf_xlmr_model_only"), texts)
    folder = os.path.join(out, "hf_xlmr_rerank")
    tokenizer = train_unigram(strings, folder)
    reranker("xlmr_rerank", write_reranker(tokenizer, folder, seed=93, family="xlmr"))

    # RoBERTa (all-distilroberta's and stsb-roberta's shape), a byte-level BPE vocabulary; the
    # converter names real RoBERTa vocabularies' pre-tokenizer roberta-bpe (GPT-2's pattern).
    folder = os.path.join(out, "hf_roberta_mean")
    tokenizer = train_bytelevel_bpe(strings[:3000], folder)
    embedder("roberta_mean", tokenizer,
             write_embedder(tokenizer, folder, "mean", True, seed=95, family="roberta"),
             pre_tokenizer="roberta-bpe")
    folder = os.path.join(out, "hf_roberta_rerank")
    tokenizer = train_bytelevel_bpe(strings[:3000], folder)
    reranker("roberta_rerank", write_reranker(tokenizer, folder, seed=96, family="roberta"),
             pre_tokenizer="roberta-bpe")

    # DistilBERT (msmarco-distilbert's shape), a WordPiece vocabulary. Its reranker's head runs
    # ReLU where llama.cpp runs tanh: that one is not converted.
    folder = os.path.join(out, "hf_distilbert_mean")
    tokenizer = train_wordpiece(strings[:3000], True, folder, distilbert=True)
    embedder("distilbert_mean", tokenizer,
             write_embedder(tokenizer, folder, "mean", True, seed=97, family="distilbert"))
    folder = os.path.join(out, "hf_distilbert_rerank")
    tokenizer = train_wordpiece(strings[:3000], True, folder, distilbert=True)
    reranker("distilbert_rerank", write_reranker(tokenizer, folder, seed=98, family="distilbert"),
             gguf=False)

    # nomic-bert (nomic-embed-text's block): as transformers 5 saves it and with the hub's
    # config.json, that one through llama.cpp's converter; llama.cpp's own embeddings of the
    # file beside sentence-transformers' (the texts both tokenise alike).
    folder = os.path.join(out, "hf_nomic_mean")
    hub_folder = os.path.join(out, "hf_nomic_hub")
    tokenizer = train_wordpiece(strings[:3000], True, folder)
    reference = write_nomic(tokenizer, folder, hub_folder, seed=94)
    gguf_dir = os.path.join(out, "gguf_nomic_mean_f32")
    path = os.path.join(gguf_dir, "model.gguf")
    convert(hub_folder, path)
    for where in (folder, hub_folder, gguf_dir):
        with open(os.path.join(where, "reference.json"), "w") as f:
            json.dump(reference, f)
    llama = llama_cpp_embeddings(path, tokenizer, TEXTS)
    with open(os.path.join(gguf_dir, "reference_llama_cpp.json"), "w") as f:
        json.dump(llama, f)
    same = {t: v for t, v in zip(reference["texts"], reference["embeddings"])}
    worst = min(float(torch.nn.functional.cosine_similarity(
        torch.tensor(v), torch.tensor(same[t]), dim=0)) for t, v in
        zip(llama["texts"], llama["embeddings"]))
    print(f"nomic-bert: llama.cpp against sentence-transformers, lowest cosine {worst:.7f} "
          f"on {len(llama['texts'])} texts")
    print(f"encoder test models in {time.time() - start:.1f} s")


if __name__ == "__main__":
    main()
