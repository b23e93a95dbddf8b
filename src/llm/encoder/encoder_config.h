// An encoder-only model (BERT's family: bert, all-MiniLM, bge, e5; RoBERTa: all-distilroberta,
// all-roberta-large; DistilBERT: msmarco-distilbert, multi-qa-distilbert; XLM-RoBERTa:
// multilingual-e5, bge-m3; nomic-bert: nomic-embed-text; and cross-encoder rerankers of those
// shapes, bge-reranker's) as its files describe it: a Hugging Face folder (config.json with
// model_type "bert", "roberta", "xlm-roberta", "distilbert" or "nomic_bert"; sentence-transformers'
// modules.json and its pooling module's config.json, Normalize) or a GGUF file from llama.cpp's
// converter (general.architecture "bert", bert.pooling_type). Served at /v1/embeddings (embedding
// models) or /v1/rerank (cross-encoders). No torch here.
#pragma once

#include <string>

#include "llm/llm_config.h"
#include "sluice/status.h"

namespace sluice::llm {

class GgufFile;

struct EncoderConfig {
  // name "bert"; hidden_size, intermediate_size, layers, heads (head_dim), vocab_size and
  // max_position_embeddings as config.json names them; rms_norm_eps holds LayerNorm's eps.
  ModelArchitecture arch;
  int type_vocab_size = 2;  // Token types (segment A, B); 0 where the file has no such table.
  // Position p's row of the position table: p + position_offset (RoBERTa's start after the
  // padding index: pad_token_id + 1; llama.cpp's converter drops those rows: 0).
  int position_offset = 0;
  // nomic-bert's block (nomic-embed-text): rotary positions (NeoX's halves, base rope_theta) in
  // place of a position table, q/k/v fused, SwiGLU feed-forward (silu(gate) * up), no biases.
  bool nomic = false;
  // DistilBERT's tensor names (transformer.layer.N.attention.q_lin, ffn.lin1, sa_layer_norm, ...)
  // and its classifier's head: pre_classifier, then ReLU (not tanh), then classifier.
  bool distilbert = false;
  double rope_theta = 10000.0;
  bool gelu_tanh = false;  // hidden_act gelu_new / gelu_pytorch_tanh; else GELU's erf form.
  // A cross-encoder (Bert-, Roberta-, XLMRoberta-, DistilBertForSequenceClassification): scores
  // of num_labels classes from the first token's final state, through a dense layer and tanh
  // (BERT's pooler, RoBERTa's classifier.dense; DistilBERT's pre_classifier and ReLU) where the
  // file has it, then the output projection. 0: an embedding model.
  int num_labels = 0;
  // An embedding model's pooling and normalisation: sentence-transformers' modules (a folder),
  // bert.pooling_type (a GGUF file, normalised as llama.cpp's server does), or the defaults
  // sentence-transformers gives a bare model (mean, not normalised); config.yaml's llm.embedding
  // overrides them.
  Pooling pooling = Pooling::kMean;
  bool normalize = false;
  // A cross-encoder's separator ([SEP], from the tokenizer): tokens after the first one are the
  // pair's second text, token type 1. -1: every token type 0 (embedding models).
  int32_t separator_id = -1;
};

// Whether `dir` (a folder or a GGUF file) holds an encoder Sluice serves this way: config.json's
// model_type "bert", "roberta", "xlm-roberta", "distilbert" or "nomic_bert", or a GGUF file of
// architecture "bert" (llama.cpp's converter writes RoBERTa's, XLM-RoBERTa's and DistilBERT's so
// too) or "nomic-bert". Never fails: anything unreadable is
// left to the decoder's loader to report.
bool IsEncoderModel(const std::string& dir);

// From a folder's config.json and sentence-transformers' files. Errors name the file and key: an
// unsupported pooling mode, a Dense module, an activation other than GELU.
Result<EncoderConfig> ParseEncoderConfig(const std::string& dir);
// From a GGUF file's metadata.
Result<EncoderConfig> EncoderConfigFromGguf(const GgufFile& file);

}  // namespace sluice::llm
