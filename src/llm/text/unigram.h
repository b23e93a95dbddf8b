// SentencePiece's Unigram tokenizer (XLM-RoBERTa, bge-m3, multilingual-e5, T5), as the tokenizers
// package runs a tokenizer.json of it: the Precompiled normalizer (SentencePiece's character map,
// a double-array trie from the model file, applied per grapheme cluster as the package applies
// it), WhitespaceSplit, Metaspace ("▁" in front of every word), then each word's most likely
// segmentation under the pieces' log-probabilities (Viterbi), a character no piece covers as the
// unknown token (consecutive ones fused). Grapheme clusters from ICU. The Tokenizer (tokenizer.h)
// splits out added tokens and adds <s> and </s>. No torch here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

// SentencePiece's precompiled character map: its normalisation rules, longest source first
// (a double-array trie over UTF-8 bytes, darts-clone's layout, and the replacement strings).
class PrecompiledCharsmap {
 public:
  // `blob`: uint32 trie size in bytes, the trie's units, then the NUL-terminated replacements.
  static Result<PrecompiledCharsmap> Parse(std::string_view blob);
  PrecompiledCharsmap() = default;
  bool empty() const { return units_.empty(); }
  // `text` normalised as the tokenizers package's Precompiled normalizer does it.
  std::string Normalize(std::string_view text) const;

 private:
  // The replacement of the shortest rule `chunk` starts with, or nullptr (the package's
  // transform(): the first result of a common-prefix search).
  const char* Transform(std::string_view chunk) const;

  std::vector<uint32_t> units_;
  std::string replacements_;
};

struct UnigramPiece {
  std::string text;  // With "▁" for spaces, as the model file writes it; empty: a placeholder.
  double score = 0;  // Log-probability.
};

// Immutable after construction; thread-safe.
class Unigram {
 public:
  Unigram(std::vector<UnigramPiece> pieces, int32_t unknown, PrecompiledCharsmap charsmap,
          bool fuse_unknown, bool byte_fallback);
  // Appends the ids of `text` (valid UTF-8, no added tokens in it): normalised, split at
  // whitespace, "▁" before each word, each word segmented.
  void Encode(std::string_view text, std::vector<int32_t>& ids) const;
  // One pre-token (already normalised and prefixed) segmented (tests).
  void EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;

 private:
  std::vector<UnigramPiece> pieces_;
  std::unordered_map<std::string, int32_t> ids_;
  size_t longest_ = 0;  // Bytes of the longest piece.
  int32_t unknown_;
  double unknown_score_;  // The lowest piece score minus 10, as the package scores it.
  PrecompiledCharsmap charsmap_;
  bool fuse_unknown_;
  bool byte_fallback_;
  std::vector<int32_t> byte_ids_ = std::vector<int32_t>(256, -1);  // <0xXX> pieces.
};

}  // namespace sluice::llm
