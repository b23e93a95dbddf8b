#include "llm/grammar.h"

#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include <exception>
#include <limits>
#include <optional>
#include <string>

#include "llm/text/tokenizer.h"

namespace sluice::llm {

class Grammar {
 public:
  explicit Grammar(xgrammar::CompiledGrammar compiled) : compiled(std::move(compiled)) {}
  const xgrammar::CompiledGrammar compiled;
};

namespace {

// Whitespace between JSON tokens: any, but at most this many characters in a row, so a model
// cannot fill its whole budget with blanks (enough for the indentation of nested documents).
constexpr int kMaxWhitespace = 24;

xgrammar::TokenizerInfo VocabularyOf(const Tokenizer& tokenizer, int vocab_size,
                                     std::vector<int32_t> stop_ids) {
  // Each token as the bytes it decodes to (xgrammar's RAW vocabulary); special tokens as "",
  // which xgrammar never allows inside a document. Ids past the tokenizer's are padding.
  const int known = std::min(tokenizer.vocab_size(), vocab_size);
  std::vector<std::string> vocab(static_cast<size_t>(known));
  for (int id = 0; id < known; ++id) {
    if (!tokenizer.IsSpecial(id)) vocab[static_cast<size_t>(id)] = tokenizer.TokenBytes(id);
  }
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, vocab_size, std::move(stop_ids));
}

}  // namespace

struct GrammarCompiler::Impl {
  Impl(const Tokenizer& tokenizer, int vocab_size, std::vector<int32_t> stop_ids)
      : compiler(VocabularyOf(tokenizer, vocab_size, std::move(stop_ids)), /*max_threads=*/1) {}
  xgrammar::GrammarCompiler compiler;

  Result<std::shared_ptr<const Grammar>> Compile(const std::string& schema, bool strict) {
    try {
      return std::make_shared<const Grammar>(compiler.CompileJSONSchema(
          schema, /*any_whitespace=*/true, /*indent=*/std::nullopt, /*separators=*/std::nullopt,
          strict, kMaxWhitespace));
    } catch (const std::exception& e) {
      return Status::InvalidArgument(fmt::format("the JSON schema cannot be used: {}", e.what()));
    }
  }
};

GrammarCompiler::GrammarCompiler(const Tokenizer& tokenizer, int vocab_size,
                                 std::vector<int32_t> stop_ids)
    : impl_(std::make_unique<Impl>(tokenizer, vocab_size, std::move(stop_ids))) {}

GrammarCompiler::~GrammarCompiler() = default;

Result<std::shared_ptr<const Grammar>> GrammarCompiler::JsonObject() {
  // Not strict: an object with any properties.
  return impl_->Compile(R"({"type": "object"})", /*strict=*/false);
}

Result<std::shared_ptr<const Grammar>> GrammarCompiler::JsonSchema(std::string_view schema) {
  return impl_->Compile(std::string(schema), /*strict=*/true);
}

struct GrammarMatcher::Impl {
  explicit Impl(std::shared_ptr<const Grammar> grammar)
      : grammar(std::move(grammar)), matcher(this->grammar->compiled) {
    const int vocab = this->grammar->compiled.GetTokenizerInfo().GetVocabSize();
    bitmask.assign(static_cast<size_t>(xgrammar::GetBitmaskSize(vocab)), 0);
    shape = static_cast<int64_t>(bitmask.size());
    tensor.data = bitmask.data();
    tensor.device = DLDevice{kDLCPU, 0};
    tensor.ndim = 1;
    tensor.dtype = xgrammar::GetBitmaskDLType();
    tensor.shape = &shape;
    tensor.strides = nullptr;
    tensor.byte_offset = 0;
  }
  std::shared_ptr<const Grammar> grammar;
  xgrammar::GrammarMatcher matcher;
  std::vector<int32_t> bitmask;  // Bit i of word i / 32: token i is allowed.
  int64_t shape = 0;
  DLTensor tensor{};
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}

GrammarMatcher::~GrammarMatcher() = default;

void GrammarMatcher::Mask(float* logits, int vocab) {
  if (!impl_->matcher.FillNextTokenBitmask(&impl_->tensor)) return;  // Every token allowed.
  const int32_t* words = impl_->bitmask.data();
  const int covered = std::min(vocab, static_cast<int>(impl_->bitmask.size()) * 32);
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < covered; ++i) {
    if (((static_cast<uint32_t>(words[i >> 5]) >> (i & 31)) & 1u) == 0) logits[i] = kNever;
  }
  for (int i = covered; i < vocab; ++i) logits[i] = kNever;
}

bool GrammarMatcher::Accept(int32_t token) { return impl_->matcher.AcceptToken(token); }

bool GrammarMatcher::Terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace sluice::llm
