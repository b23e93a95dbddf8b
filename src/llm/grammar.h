// Grammar-constrained decoding, for OpenAI's `response_format`: a JSON schema (or "any JSON
// object") is compiled against the model's vocabulary by XGrammar, and a matcher per sequence
// masks each step's logits to the tokens that keep the output a prefix of a document the grammar
// accepts, then follows the token sampled. Once the document is complete only an end-of-sequence
// token is allowed, so a sequence that stops on its own holds one whole valid document.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "sluice/status.h"

namespace sluice::llm {

class Tokenizer;
class Grammar;  // A compiled grammar; immutable, shared by the sequences that use it.

// Thread-safe. Compiled grammars are cached by their source (a repeated schema costs a lookup).
class GrammarCompiler {
 public:
  // `vocab_size`: the model's logits per row (ids past the tokenizer's are never allowed);
  // `stop_ids`: the end-of-sequence tokens that end a complete document.
  GrammarCompiler(const Tokenizer& tokenizer, int vocab_size, std::vector<int32_t> stop_ids);
  ~GrammarCompiler();
  GrammarCompiler(const GrammarCompiler&) = delete;
  GrammarCompiler& operator=(const GrammarCompiler&) = delete;

  // Any JSON object (JSON mode).
  Result<std::shared_ptr<const Grammar>> JsonObject();
  // Documents valid under `schema` (JSON Schema text). Properties the schema does not declare
  // are not generated. kInvalidArgument, with XGrammar's reason, for a schema it cannot compile.
  Result<std::shared_ptr<const Grammar>> JsonSchema(std::string_view schema);
  // As JsonSchema, written one way only: ", " and ": " between items, no other whitespace (tool
  // calls, whose text nobody reads, cost no tokens on layout).
  Result<std::shared_ptr<const Grammar>> CompactJsonSchema(std::string_view schema);
  // XGrammar's structural tag (its JSON format): free text where the tag allows it, constrained
  // content inside the tags it opens (tool calls a reply may or may not make).
  Result<std::shared_ptr<const Grammar>> StructuralTag(std::string_view tag);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One sequence's position in a grammar. Thread-compatible.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);
  ~GrammarMatcher();
  GrammarMatcher(const GrammarMatcher&) = delete;
  GrammarMatcher& operator=(const GrammarMatcher&) = delete;

  // Sets to -infinity the `vocab` logits of every token the grammar does not allow next, and of
  // every token that would make the text invalid UTF-8 (XGrammar alone lets a byte-level
  // vocabulary spell surrogates).
  void Mask(float* logits, int vocab);
  // The same tokens as bits (token t: bit t % 32 of word t / 32, set where allowed next): what
  // Mask leaves, for a model that masks where the logits are.
  void Allowed(int vocab, std::vector<uint32_t>* bits);
  // Follows `token`; false (and no change) when the grammar or UTF-8 does not allow it.
  bool Accept(int32_t token);
  // The document is complete and an end-of-sequence token was accepted.
  bool Terminated() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::llm
