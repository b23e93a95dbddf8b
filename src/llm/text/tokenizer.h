// The Hugging Face `tokenizer.json` byte-level BPE tokenizer, in C++: added (special) tokens
// split out first, then the pre-tokenizer (Digits, Split, ByteLevel's regex, in sequence), then
// BPE merges by rank; decoding maps byte-level characters back to bytes. Regular expressions run
// on PCRE2 with Unicode properties (\p{L}, \p{N}, look-ahead), which std::regex lacks. From GGUF
// files also SentencePiece vocabularies (tokenizer.ggml.model "llama": Llama 2, Mistral 7B,
// Phi-3, Gemma, TinyLlama), tokenised as llama.cpp does: "▁" for spaces and one in front of the
// text and after each special token (add_space_prefix), pairs merged by score, byte fallback.
// WordPiece vocabularies (BERT's, tokenizer.json or GGUF's "bert") through wordpiece.h, Unigram
// ones (XLM-RoBERTa's, tokenizer.json or GGUF's "t5") through unigram.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

class GgufFile;

// The special tokens a post-processor puts around a pair of texts: BERT's [CLS] A [SEP] B [SEP]
// is {[CLS]}, {[SEP]}, {[SEP]}.
struct PairTemplate {
  std::vector<int32_t> prefix, middle, suffix;
  bool empty() const { return prefix.empty() && middle.empty() && suffix.empty(); }
};

// Immutable after Load(); thread-safe.
class Tokenizer {
 public:
  // Reads `dir`/tokenizer.json (or, where there is none, SentencePiece's `dir`/tokenizer.model as
  // transformers converts it) and, when present, `dir`/tokenizer_config.json (bos/eos tokens).
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  // From a GGUF file's metadata (tokenizer.ggml.*: a "gpt2" byte-level BPE vocabulary, merges,
  // token types, the pre-tokenizer type, bos/eos, add_bos_token, the chat template), splitting
  // text as llama.cpp's pre-tokenizer of that type does.
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);
  ~Tokenizer();

  // Text (valid UTF-8, which the caller checks) to ids. Added tokens in the text are recognised
  // as themselves; `add_special_tokens` adds the post-processor's prefix and suffix (e.g. BOS).
  std::vector<int32_t> Encode(std::string_view text, bool add_special_tokens = false) const;

  // A pair of texts (a cross-encoder's query and document) joined by the post-processor's pair
  // template, special tokens included.
  std::vector<int32_t> EncodePair(std::string_view first, std::string_view second) const;
  bool has_pair_template() const;
  const PairTemplate& pair_template() const;

  // Ids to text; bytes that do not form UTF-8 become U+FFFD. Special tokens are left out with
  // `skip_special`. A SentencePiece vocabulary's space prefix is dropped from the first token, as
  // llama.cpp and transformers decode (StreamDecoder keeps it: generated text follows a prompt).
  std::string Decode(const std::vector<int32_t>& ids, bool skip_special = false) const;

  // The bytes one token stands for ("" for ids out of range).
  const std::string& TokenBytes(int32_t id) const;
  bool IsSpecial(int32_t id) const;
  // The id of an exact token string (as in the vocab or added tokens); -1 when absent.
  int32_t TokenId(std::string_view token) const;
  int vocab_size() const;

  const std::string& bos_token() const;  // From tokenizer_config.json; may be empty.
  const std::string& eos_token() const;
  const std::string& chat_template() const;  // tokenizer_config.json or chat_template.jinja.

  class Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Turns a stream of token ids into text, never emitting part of a UTF-8 character: bytes of an
// unfinished character wait for the next token. Thread-compatible.
class StreamDecoder {
 public:
  StreamDecoder(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(tokenizer), skip_special_(skip_special) {}
  // The text that `id` completes (possibly empty).
  std::string Push(int32_t id);
  // Whatever is left, invalid bytes as U+FFFD.
  std::string Flush();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;
};

// Length of the longest prefix of `bytes` that ends on a character boundary, treating a
// truncated character at the very end as unfinished (not counted). Invalid bytes count as
// complete (they become U+FFFD).
size_t CompleteUtf8Prefix(std::string_view bytes);
// `bytes` with each invalid UTF-8 sequence replaced by U+FFFD (as Rust's from_utf8_lossy).
std::string Utf8Lossy(std::string_view bytes);
bool IsValidUtf8(std::string_view bytes);

}  // namespace sluice::llm
