// BERT's WordPiece tokenizer (bert, all-MiniLM, bge, e5, nomic-embed's vocabularies), as the
// tokenizers package runs it: BertNormalizer (control characters dropped and whitespace made
// spaces, spaces around CJK ideographs, accents stripped after NFD, lowercasing per character),
// BertPreTokenizer (split at whitespace, each punctuation character a word of its own), then each
// word as its longest vocabulary prefix and "##" continuations, the unknown token for a word that
// does not split so or is longer than max_input_chars_per_word. Unicode properties and
// normalisation from ICU. The Tokenizer (tokenizer.h) splits out added tokens and adds [CLS] and
// [SEP]. No torch here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace sluice::llm {

struct WordPieceOptions {
  bool clean_text = true;
  bool handle_chinese_chars = true;
  bool strip_accents = true;  // tokenizer.json's null: as `lowercase`.
  bool lowercase = true;
  std::string continuing_prefix = "##";
  int max_input_chars_per_word = 100;
};

// Immutable after construction; thread-safe.
class WordPiece {
 public:
  // `vocab`: the model's tokens ("##" continuations as such) and ids; `unknown`: the unknown
  // token's id.
  WordPiece(WordPieceOptions options, std::unordered_map<std::string, int32_t> vocab,
            int32_t unknown);

  // Appends the ids of `text` (valid UTF-8, no added tokens in it).
  void Encode(std::string_view text, std::vector<int32_t>& ids) const;
  // The normalised text's words, as the pre-tokenizer splits them (tests).
  std::vector<std::string> Words(std::string_view text) const;

  const WordPieceOptions& options() const { return options_; }

 private:
  void EncodeWord(const std::string& word, size_t chars, std::vector<int32_t>& ids) const;

  WordPieceOptions options_;
  std::unordered_map<std::string, int32_t> vocab_;
  int32_t unknown_;
};

}  // namespace sluice::llm
