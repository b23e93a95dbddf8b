// Tokenizer::Impl, the tokenizer's state and loaders, shared by the files that define them:
// tokenizer.cc (byte-level BPE, SentencePiece BPE, the post-processor and tokenizer_config.json)
// and tokenizer_encoders.cc (the encoders' WordPiece and Unigram vocabularies). Private to
// src/llm/text/.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "llm/text/tokenizer.h"
#include "llm/text/unigram.h"
#include "llm/text/wordpiece.h"
#include "sluice/status.h"

namespace sentencepiece {
class ModelProto;
}

namespace sluice::llm {

struct Regex;  // A compiled PCRE2 pattern (tokenizer.cc).

// GPT-2's byte-level alphabet: each byte's code point (tokenizer.cc).
std::vector<uint32_t> ByteToCodePoint();

struct PreTokenizerStep {
  enum Kind { kIsolate, kRemove } kind = kIsolate;  // What happens to a match.
  std::shared_ptr<Regex> regex;
  bool add_prefix_space = false;  // ByteLevel only.
};

// Reads an optional field; `out` keeps its value when the field is absent or of another type.
template <typename T>
void ReadOptional(simdjson::simdjson_result<simdjson::dom::element> field, T& out) {
  T value;
  if (field.get(value) == simdjson::SUCCESS) out = value;
}

// A token matched in text as itself before anything else is split (special and user-defined
// tokens). `lstrip` / `rstrip`: whitespace before / after it in the text is dropped.
struct AddedToken {
  std::string text;
  int32_t id = 0;
  bool lstrip = false;
  bool rstrip = false;
};

// tokenizer_config.json, read once: the special tokens (strings or {"content": ...}), the chat
// template (or chat_template.jinja beside it), and what a folder with a SentencePiece model alone
// needs: the tokenizer class, legacy, add_bos_token / add_eos_token, add_prefix_space and
// added_tokens_decoder. Tokens the file does not name are empty.
struct HfTokenizerConfig {
  std::string bos, eos, unk, pad, mask, chat_template, tokenizer_class;
  bool legacy = false, add_bos = true, add_eos = false, add_prefix_space = true;
  std::vector<std::pair<AddedToken, bool>> added;  // With whether each is special.
};

// `dir`'s tokenizer_config.json (none: the defaults) and chat_template.jinja.
Status ReadHfTokenizerConfig(const std::string& dir, HfTokenizerConfig* out);

// GGUF's token types (tokenizer.ggml.token_type), as llama.cpp's converter writes them.
enum GgufTokenType : int64_t {
  kGgufNormal = 1,
  kGgufUnknown = 2,
  kGgufControl = 3,
  kGgufUserDefined = 4,
  kGgufUnused = 5,
  kGgufByte = 6,
};

// A SentencePiece piece's text when decoded: "▁" is a space.
std::string MetaspaceBytes(const std::string& piece);
// A WordPiece token's text when decoded: a "##" continuation glued to the piece before it, any
// other piece a word after a space (the decoder drops the text's first).
std::string WordPieceBytes(const std::string& token);

class Tokenizer::Impl {
 public:
  Impl() {
    for (uint32_t b = 0; b < 256; ++b) cp_byte[byte_cp_table[b]] = static_cast<uint8_t>(b);
  }
  Status Load(const std::string& dir);
  Status LoadGguf(const GgufFile& file);
  // tokenizer.ggml.model "llama": a SentencePiece vocabulary (tokens with scores, "▁" for spaces,
  // <0xXX> byte tokens), from tokens and their types already checked.
  Status LoadGgufSentencePiece(const GgufFile& file, const std::vector<std::string>& tokens,
                               const std::vector<int64_t>& types);
  // A SentencePiece vocabulary from a GGUF file or a tokenizer.model: tokens, their types (the
  // two formats number them alike) and scores.
  Status LoadSentencePieceVocabulary(const std::string& path,
                                     const std::vector<std::string>& tokens,
                                     const std::vector<int64_t>& types);
  // A Hugging Face folder's tokenizer.model or sentencepiece.bpe.model (SentencePiece's own file,
  // where there is no tokenizer.json) with tokenizer_config.json's added tokens and settings.
  Status LoadSentencePieceModel(const std::string& dir, const std::string& path);
  // A SentencePiece Unigram model file as transformers' XLM-RoBERTa class converts it.
  Status LoadXlmRobertaSentencePiece(const sentencepiece::ModelProto& proto,
                                     const HfTokenizerConfig& config, const std::string& path);
  // tokenizer_config.json: bos/eos tokens and the chat template (and chat_template.jinja).
  Status LoadTokenizerConfig(const std::string& dir);
  // SentencePiece's BPE as llama.cpp runs it on one piece of text: spaces become "▁" (one more
  // in front when `space_prefix`), characters merge pairwise, the highest-scoring pair that is a
  // token first; what forms no token falls back to byte tokens.
  void EncodeSentencePiece(std::string_view text, bool space_prefix,
                           std::vector<int32_t>& ids) const;
  // A byte-level token string (GPT-2's alphabet) as the bytes it stands for; false when it is
  // not UTF-8. Characters outside the alphabet are kept as they are.
  bool ByteLevelBytes(const std::string& token, std::string* bytes) const;
  // Merge `rank`: left + right; an error names a token missing from the vocab.
  Status AddMerge(const std::string& left, const std::string& right, int32_t rank,
                  const std::string& source);
  // Sorts the added tokens longest first and finds each byte's token: after the vocab is read.
  void Finish();
  Status LoadPreTokenizer(simdjson::dom::element spec);
  // tokenizer.json's post_processor: the special tokens around one sequence (prefix, suffix) and
  // around a pair (pair_template).
  Status LoadPostProcessor(simdjson::simdjson_result<simdjson::dom::element> spec,
                           const std::string& path);
  // tokenizer.json's Unigram model with its Precompiled normalizer and WhitespaceSplit +
  // Metaspace pre-tokenizer, its added tokens and post-processor.
  Status LoadUnigram(simdjson::dom::element root, const std::string& path);
  // The Unigram vocabulary either source gives: the pieces (by id), then the added tokens (ids
  // past the pieces' allowed) with whether each is special; decoded as Metaspace decodes.
  void SetUnigram(std::vector<UnigramPiece> pieces, int32_t unknown, PrecompiledCharsmap charsmap,
                  bool byte_fallback, std::vector<std::pair<AddedToken, bool>> added_tokens);
  // tokenizer.ggml.model "t5": a Unigram vocabulary (XLM-RoBERTa's, T5's) with scores and the
  // precompiled character map.
  Status LoadGgufUnigram(const GgufFile& file, const std::vector<std::string>& tokens,
                         const std::vector<int64_t>& types);
  // tokenizer.json's WordPiece model with its BertNormalizer and BertPreTokenizer.
  Status LoadWordPiece(simdjson::dom::element root,
                       std::unordered_map<std::string, int32_t> model_vocab,
                       const std::string& path);
  // tokenizer.ggml.model "bert": llama.cpp's converter writes a word's first piece with "▁" in
  // front and continuations bare; the normalizer's settings are tokenizer.ggml.normalizer.*.
  Status LoadGgufWordPiece(const GgufFile& file, const std::vector<std::string>& tokens,
                           const std::vector<int64_t>& types);
  // `after_special`: the text starts the input or follows a special token (SentencePiece
  // vocabularies then add their space prefix).
  // `at_start`: the text starts the input (tokenizer.json's Metaspace prepends only there).
  void EncodeText(std::string_view text, bool after_special, bool at_start,
                  std::vector<int32_t>& ids) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;
  void MergeByRank(const std::vector<int32_t>& initial, std::vector<int32_t>& ids) const;
  // tokenizer.json's SentencePiece-style BPE (Llama 2, Mistral, Phi-3, Gemma): the normalizer
  // (Prepend, Replace " " with "▁") on each segment between added tokens, Metaspace (prepend
  // "▁" always, or to the input's first segment only, and split before each "▁" if asked), then
  // BPE by rank over characters, a character not in the vocabulary as its <0xXX> byte tokens
  // (byte_fallback) or the unknown token (consecutive ones fused, fuse_unk).
  void EncodeHfSentencePiece(std::string_view text, bool at_start, std::vector<int32_t>& ids) const;
  void EncodeHfSentencePieceWord(std::string_view word, std::vector<int32_t>& ids) const;
  Status LoadHfSentencePiece(simdjson::dom::element root, const std::string& path);
  void Split(std::string_view text, std::vector<std::string_view>& pieces) const;

  std::unordered_map<std::string, int32_t> vocab;  // Byte-level strings and added tokens.
  std::vector<std::string> id_bytes;               // Decoded bytes of each id.
  std::vector<bool> special;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged)
  std::vector<AddedToken> added;                                     // Longest first.
  std::vector<PreTokenizerStep> steps;
  std::vector<int32_t> prefix, suffix;            // Post-processor special tokens.
  PairTemplate pair_template;                     // And around a pair of texts.
  std::unique_ptr<WordPiece> wordpiece;           // A WordPiece vocabulary (BERT's).
  std::unique_ptr<Unigram> unigram;               // A Unigram vocabulary (XLM-RoBERTa's).
  std::vector<int32_t> byte_ids;                  // Byte -> id of its byte-level character.
  std::unordered_map<uint32_t, uint8_t> cp_byte;  // GPT-2's alphabet back to bytes.
  std::vector<uint32_t> byte_cp_table = ByteToCodePoint();  // And bytes to it.
  bool ignore_merges = false;  // A piece that is a token as a whole is that token (llama3).
  std::string bos, eos, chat_template;
  // SentencePiece vocabularies (merges by score instead of by rank).
  bool sentencepiece = false;
  bool add_space_prefix = false;  // A space in front of the text (and after special tokens).
  std::vector<float> scores;      // By id.
  std::vector<int32_t> byte_tokens = std::vector<int32_t>(256, -1);  // <0xXX> by byte.
  int32_t unknown_id = -1;  // For a byte with no token of its own.
  // tokenizer.json's SentencePiece-style BPE (see EncodeHfSentencePiece).
  bool hf_sentencepiece = false;
  std::string normalizer_prepend;  // Prepend: put before each segment.
  bool normalizer_spaces = false;  // Replace " " with "▁".
  bool metaspace = false;
  enum class MetaspacePrepend {
    kNever,
    kFirst,
    kAlways
  } metaspace_prepend = MetaspacePrepend::kAlways;
  bool metaspace_split = false;
  bool byte_fallback = false;
  bool fuse_unknown = false;
  bool strip_decoded_space = false;  // The decoder drops one space in front of the text.
};

}  // namespace sluice::llm
