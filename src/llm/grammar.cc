#include "llm/grammar.h"

#include <fmt/format.h>
#include <xgrammar/xgrammar.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <optional>
#include <string>

#include "llm/text/harmony.h"
#include "llm/text/tokenizer.h"

namespace sluice::llm {

namespace {

// The UTF-8 decoder's state between two bytes: 0 at a character boundary, else how many
// continuation bytes are still due and the range the next one must lie in (RFC 3629: no
// overlong forms, no surrogates, nothing past U+10FFFF).
constexpr int kUtf8States = 8;
struct Utf8State {
  int need;
  uint8_t low, high;
};
constexpr Utf8State kUtf8[kUtf8States] = {{0, 0, 0},       {1, 0x80, 0xBF}, {2, 0x80, 0xBF},
                                          {2, 0xA0, 0xBF}, {2, 0x80, 0x9F}, {3, 0x80, 0xBF},
                                          {3, 0x90, 0xBF}, {3, 0x80, 0x8F}};

// The state after `byte`, or -1 where the byte makes the text invalid UTF-8.
int Utf8Next(int state, uint8_t byte) {
  const Utf8State& s = kUtf8[state];
  if (s.need > 0) {
    if (byte < s.low || byte > s.high) return -1;
    return s.need == 1 ? 0 : s.need == 2 ? 1 : 2;
  }
  if (byte < 0x80) return 0;
  if (byte >= 0xC2 && byte <= 0xDF) return 1;
  if (byte == 0xE0) return 3;
  if (byte == 0xED) return 4;
  if (byte >= 0xE1 && byte <= 0xEF) return 2;
  if (byte == 0xF0) return 6;
  if (byte >= 0xF1 && byte <= 0xF3) return 5;
  if (byte == 0xF4) return 7;
  return -1;
}

}  // namespace

// XGrammar matches characters as code points and lets a byte-level vocabulary spell some that
// UTF-8 forbids (surrogates, U+D800-U+DFFF, inside strings), so the matcher also keeps the text
// valid UTF-8: per decoder state, the state each token leaves it in (-1: the token is invalid).
// A special token (a stop token, harmony's markers) only at a character boundary: text cut
// inside a character before it would stay invalid.
struct Utf8Table {
  Utf8Table(const Tokenizer& tokenizer, int vocab_size)
      : vocab(vocab_size), next(static_cast<size_t>(kUtf8States) * vocab_size, 0) {
    const int known = std::min(tokenizer.vocab_size(), vocab_size);
    for (int state = 0; state < kUtf8States; ++state) {
      for (int id = 0; id < vocab_size; ++id) {
        int at = state;
        if (id < known && tokenizer.IsSpecial(id)) {
          at = state == 0 ? 0 : -1;
        } else if (id < known) {
          for (const char c : tokenizer.TokenBytes(id)) {
            at = Utf8Next(at, static_cast<uint8_t>(c));
            if (at < 0) break;
          }
        }
        next[static_cast<size_t>(state) * vocab_size + id] = static_cast<int8_t>(at);
      }
    }
  }
  const int8_t* row(int state) const { return next.data() + static_cast<size_t>(state) * vocab; }
  int vocab;
  std::vector<int8_t> next;
};

class Grammar {
 public:
  Grammar(xgrammar::CompiledGrammar compiled, std::shared_ptr<const Utf8Table> utf8)
      : compiled(std::move(compiled)), utf8(std::move(utf8)) {}
  const xgrammar::CompiledGrammar compiled;
  const std::shared_ptr<const Utf8Table> utf8;
};

namespace {

// Whitespace between JSON tokens: any, but at most this many characters in a row (as llama.cpp's
// JSON-schema grammars bound it), so a model cannot spend its whole budget on blanks; a newline
// and the indentation of three levels fit.
constexpr int kMaxWhitespace = 8;

xgrammar::TokenizerInfo VocabularyOf(const Tokenizer& tokenizer, int vocab_size,
                                     std::vector<int32_t> stop_ids) {
  // Each token as the bytes it decodes to (xgrammar's RAW vocabulary); special tokens as "",
  // which xgrammar never allows inside a document, but for harmony's markers in a harmony
  // vocabulary (gpt-oss's), which its replies' grammars name as tokens (HarmonyReplyTag) and
  // xgrammar accepts only with their text. Ids past the tokenizer's are padding.
  const int known = std::min(tokenizer.vocab_size(), vocab_size);
  std::vector<std::string> vocab(static_cast<size_t>(known));
  for (int id = 0; id < known; ++id) {
    if (!tokenizer.IsSpecial(id)) vocab[static_cast<size_t>(id)] = tokenizer.TokenBytes(id);
  }
  if (tokenizer.TokenId("<|channel|>") >= 0 && tokenizer.TokenId("<|message|>") >= 0) {
    for (const std::string_view marker : kHarmonyMarkers) {
      const int32_t id = tokenizer.TokenId(marker);
      if (id >= 0 && id < known) vocab[static_cast<size_t>(id)] = std::string(marker);
    }
  }
  return xgrammar::TokenizerInfo(vocab, xgrammar::VocabType::RAW, vocab_size, std::move(stop_ids));
}

}  // namespace

struct GrammarCompiler::Impl {
  Impl(const Tokenizer& tokenizer, int vocab_size, std::vector<int32_t> stop_ids)
      : compiler(VocabularyOf(tokenizer, vocab_size, std::move(stop_ids)), /*max_threads=*/1),
        utf8(std::make_shared<const Utf8Table>(tokenizer, vocab_size)) {}
  xgrammar::GrammarCompiler compiler;
  const std::shared_ptr<const Utf8Table> utf8;

  Result<std::shared_ptr<const Grammar>> Compile(const std::string& schema, bool strict,
                                                 bool any_whitespace = true) {
    try {
      return std::make_shared<const Grammar>(
          compiler.CompileJSONSchema(schema, any_whitespace, /*indent=*/std::nullopt,
                                     /*separators=*/std::nullopt, strict, kMaxWhitespace),
          utf8);
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

Result<std::shared_ptr<const Grammar>> GrammarCompiler::CompactJsonSchema(std::string_view schema) {
  return impl_->Compile(std::string(schema), /*strict=*/true, /*any_whitespace=*/false);
}

Result<std::shared_ptr<const Grammar>> GrammarCompiler::StructuralTag(std::string_view tag) {
  try {
    return std::make_shared<const Grammar>(impl_->compiler.CompileStructuralTag(std::string(tag)),
                                           impl_->utf8);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(fmt::format("the tool schemas cannot be used: {}", e.what()));
  }
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
  int utf8_state = 0;             // Of the text accepted so far.
  std::vector<uint32_t> allowed;  // Mask's, from Allowed.
};

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar)
    : impl_(std::make_unique<Impl>(std::move(grammar))) {}

GrammarMatcher::~GrammarMatcher() = default;

void GrammarMatcher::Allowed(int vocab, std::vector<uint32_t>* bits) {
  const bool restricted = impl_->matcher.FillNextTokenBitmask(&impl_->tensor);
  const int32_t* words = impl_->bitmask.data();
  const Utf8Table& utf8 = *impl_->grammar->utf8;
  const int8_t* next = utf8.row(impl_->utf8_state);
  const int covered = std::min({vocab, static_cast<int>(impl_->bitmask.size()) * 32, utf8.vocab});
  bits->assign(static_cast<size_t>((vocab + 31) / 32), 0u);  // Past `covered`: never.
  for (int i = 0; i < covered; ++i) {
    const bool allowed =
        !restricted || ((static_cast<uint32_t>(words[i >> 5]) >> (i & 31)) & 1u) != 0;
    if (allowed && next[i] >= 0) (*bits)[static_cast<size_t>(i >> 5)] |= 1u << (i & 31);
  }
}

void GrammarMatcher::Mask(float* logits, int vocab) {
  Allowed(vocab, &impl_->allowed);
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < vocab; ++i) {
    if (((impl_->allowed[static_cast<size_t>(i >> 5)] >> (i & 31)) & 1u) == 0) logits[i] = kNever;
  }
}

bool GrammarMatcher::Accept(int32_t token) {
  const Utf8Table& utf8 = *impl_->grammar->utf8;
  if (token < 0 || token >= utf8.vocab) return false;
  const int next = utf8.row(impl_->utf8_state)[token];
  if (next < 0 || !impl_->matcher.AcceptToken(token)) return false;
  impl_->utf8_state = next;
  return true;
}

bool GrammarMatcher::Terminated() const { return impl_->matcher.IsTerminated(); }

}  // namespace sluice::llm
