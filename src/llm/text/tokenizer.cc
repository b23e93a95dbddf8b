#include "llm/text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace sluice::llm {
namespace {

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest shift to 256+.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> table(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    table[b] = printable ? b : next++;
  }
  return table;
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid UTF-8 sequence at `s` (1-4), 0 if invalid, -1 if truncated at the end.
int SequenceLength(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return 1;
  int len = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
    len = 4, min = 0x10000;
  } else {
    return 0;
  }
  uint32_t cp = b0 & (0x7F >> len);
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[static_cast<size_t>(i)]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
    // Reject overlong and surrogate prefixes as early as the second byte allows.
    if (i == 1 && ((len == 3 && b0 == 0xE0 && b < 0xA0) || (len == 3 && b0 == 0xED && b >= 0xA0) ||
                   (len == 4 && b0 == 0xF0 && b < 0x90) || (len == 4 && b0 == 0xF4 && b >= 0x90))) {
      return 0;
    }
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

struct Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

struct PreTokenizerStep {
  enum Kind { kIsolate, kRemove } kind = kIsolate;  // What happens to a match.
  std::shared_ptr<Regex> regex;
  bool add_prefix_space = false;  // ByteLevel only.
};

Result<std::shared_ptr<Regex>> CompileRegex(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto regex = std::make_shared<Regex>();
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument(fmt::format("tokenizer regex '{}' does not compile at {}: {}",
                                               pattern, offset, reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // Falls back to the interpreter.
  return regex;
}

// GPT-2's split, as the ByteLevel pre-tokenizer of the tokenizers package uses it.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Reads an optional field; `out` keeps its value when the field is absent or of another type.
template <typename T>
void ReadOptional(simdjson::simdjson_result<simdjson::dom::element> field, T& out) {
  T value;
  if (field.get(value) == simdjson::SUCCESS) out = value;
}

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

class Tokenizer::Impl {
 public:
  Status Load(const std::string& dir);
  Status LoadPreTokenizer(simdjson::dom::element spec);
  void EncodeText(std::string_view text, std::vector<int32_t>& ids) const;
  void EncodeWord(std::string_view word, std::vector<int32_t>& ids) const;
  void Split(std::string_view text, std::vector<std::string_view>& pieces) const;

  std::unordered_map<std::string, int32_t> vocab;  // Byte-level strings and added tokens.
  std::vector<std::string> id_bytes;               // Decoded bytes of each id.
  std::vector<bool> special;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (a, b) -> (rank, merged)
  std::vector<std::pair<std::string, int32_t>> added;                // Longest first.
  std::vector<PreTokenizerStep> steps;
  std::vector<int32_t> prefix, suffix;  // Post-processor special tokens.
  std::vector<int32_t> byte_ids;        // Byte -> id of its byte-level character.
  std::string bos, eos, chat_template;
};

Status Tokenizer::Impl::LoadPreTokenizer(simdjson::dom::element spec) {
  if (spec.is_null()) return Status::Ok();
  std::string_view type;
  if (spec["type"].get(type) != simdjson::SUCCESS) {
    return Status::InvalidArgument("tokenizer.json: pre_tokenizer has no type");
  }
  if (type == "Sequence") {
    simdjson::dom::array items;
    if (spec["pretokenizers"].get(items) != simdjson::SUCCESS) {
      return Status::InvalidArgument("tokenizer.json: Sequence without pretokenizers");
    }
    for (auto item : items) SLUICE_RETURN_IF_ERROR(LoadPreTokenizer(item));
    return Status::Ok();
  }
  PreTokenizerStep step;
  std::string pattern;
  if (type == "ByteLevel") {
    bool use_regex = true, prefix_space = false;
    ReadOptional(spec["use_regex"], use_regex);
    ReadOptional(spec["add_prefix_space"], prefix_space);
    if (!use_regex && !prefix_space) return Status::Ok();
    step.add_prefix_space = prefix_space;
    pattern = use_regex ? kByteLevelPattern : "";
  } else if (type == "Digits") {
    bool individual = false;
    ReadOptional(spec["individual_digits"], individual);
    pattern = individual ? R"(\p{N})" : R"(\p{N}+)";
  } else if (type == "Split") {
    std::string_view regex, behavior;
    bool invert = false;
    ReadOptional(spec["invert"], invert);
    if (spec["pattern"]["Regex"].get(regex) != simdjson::SUCCESS &&
        spec["pattern"]["String"].get(regex) != simdjson::SUCCESS) {
      return Status::InvalidArgument("tokenizer.json: Split without a pattern");
    }
    if (spec["pattern"]["String"].get(regex) == simdjson::SUCCESS) {
      std::string quoted = "\\Q" + std::string(regex) + "\\E";
      pattern = quoted;
    } else {
      pattern = std::string(regex);
    }
    ReadOptional(spec["behavior"], behavior);
    if (invert || (behavior != "Isolated" && behavior != "Removed")) {
      return Status::InvalidArgument(
          fmt::format("tokenizer.json: Split behavior '{}'{} is not supported (Isolated, Removed)",
                      behavior, invert ? " inverted" : ""));
    }
    if (behavior == "Removed") step.kind = PreTokenizerStep::kRemove;
  } else {
    return Status::InvalidArgument(fmt::format(
        "tokenizer.json: pre-tokenizer '{}' is not supported (ByteLevel, Digits, Split, Sequence)",
        type));
  }
  if (!pattern.empty()) {
    auto regex = CompileRegex(pattern);
    if (!regex.ok()) return regex.status();
    step.regex = *regex;
  }
  steps.push_back(std::move(step));
  return Status::Ok();
}

Status Tokenizer::Impl::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "tokenizer.json";
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.load(path.string()).get(root) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: cannot read it as JSON", path.string()));
  }
  simdjson::dom::element model = root["model"];
  std::string_view type;
  if (model["type"].get(type) != simdjson::SUCCESS || type != "BPE") {
    return Status::InvalidArgument(
        fmt::format("{}: model type '{}' is not BPE", path.string(), type));
  }
  bool flag = false;
  if (model["byte_fallback"].get(flag) == simdjson::SUCCESS && flag) {
    return Status::InvalidArgument(
        fmt::format("{}: byte_fallback BPE is not supported", path.string()));
  }
  std::string_view affix;
  if ((model["continuing_subword_prefix"].get(affix) == simdjson::SUCCESS && !affix.empty()) ||
      (model["end_of_word_suffix"].get(affix) == simdjson::SUCCESS && !affix.empty())) {
    return Status::InvalidArgument(
        fmt::format("{}: subword prefixes and suffixes are not supported", path.string()));
  }
  simdjson::dom::element normalizer = root["normalizer"];
  if (!normalizer.is_null()) {
    return Status::InvalidArgument(fmt::format("{}: normalizers are not supported", path.string()));
  }
  simdjson::dom::object vocab_json;
  if (model["vocab"].get(vocab_json) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: no vocab", path.string()));
  }
  const std::vector<uint32_t> byte_cp = ByteToCodePoint();
  std::unordered_map<uint32_t, uint8_t> cp_byte;
  for (uint32_t b = 0; b < 256; ++b) cp_byte[byte_cp[b]] = static_cast<uint8_t>(b);
  int64_t max_id = -1;
  for (auto field : vocab_json) {
    int64_t id = 0;
    if (field.value.get(id) != simdjson::SUCCESS || id < 0 || id > (1 << 24)) {
      return Status::InvalidArgument(fmt::format("{}: bad vocab id", path.string()));
    }
    vocab.emplace(std::string(field.key), static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  simdjson::dom::array added_json;
  if (root["added_tokens"].get(added_json) == simdjson::SUCCESS) {
    for (auto item : added_json) {
      int64_t id = 0;
      std::string_view content;
      if (item["id"].get(id) != simdjson::SUCCESS ||
          item["content"].get(content) != simdjson::SUCCESS || id < 0 || id > (1 << 24)) {
        return Status::InvalidArgument(fmt::format("{}: bad added token", path.string()));
      }
      max_id = std::max(max_id, id);
      added.emplace_back(std::string(content), static_cast<int32_t>(id));
    }
  }
  id_bytes.assign(static_cast<size_t>(max_id + 1), "");
  special.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab) {
    // Byte-level characters back to bytes.
    std::string bytes;
    for (size_t i = 0; i < token.size();) {
      const int len = SequenceLength(std::string_view(token).substr(i));
      if (len <= 0)
        return Status::InvalidArgument(fmt::format("{}: vocab is not UTF-8", path.string()));
      uint32_t cp = static_cast<unsigned char>(token[i]) & (len == 1 ? 0x7F : (0x7F >> len));
      for (int j = 1; j < len; ++j)
        cp = (cp << 6) | (static_cast<unsigned char>(token[i + static_cast<size_t>(j)]) & 0x3F);
      auto it = cp_byte.find(cp);
      if (it == cp_byte.end()) {  // Not byte-level: keep the text itself.
        bytes.append(token, i, static_cast<size_t>(len));
      } else {
        bytes += static_cast<char>(it->second);
      }
      i += static_cast<size_t>(len);
    }
    id_bytes[static_cast<size_t>(id)] = bytes;
  }
  for (auto item : added_json) {
    int64_t id = 0;
    std::string_view content;
    bool is_special = false;
    ReadOptional(item["id"], id);
    ReadOptional(item["content"], content);
    ReadOptional(item["special"], is_special);
    id_bytes[static_cast<size_t>(id)] = std::string(content);
    special[static_cast<size_t>(id)] = is_special;
    vocab[std::string(content)] = static_cast<int32_t>(id);
  }
  std::sort(added.begin(), added.end(),
            [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  byte_ids.assign(256, -1);
  for (uint32_t b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(byte_cp[b], ch);
    auto it = vocab.find(ch);
    if (it != vocab.end()) byte_ids[b] = it->second;
  }
  simdjson::dom::array merges_json;
  if (model["merges"].get(merges_json) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: no merges", path.string()));
  }
  int32_t rank = 0;
  for (auto item : merges_json) {
    std::string left, right;
    std::string_view text;
    simdjson::dom::array pair;
    if (item.get(text) == simdjson::SUCCESS) {
      const size_t space = text.find(' ');
      if (space == std::string_view::npos)
        return Status::InvalidArgument("tokenizer.json: bad merge");
      left = std::string(text.substr(0, space));
      right = std::string(text.substr(space + 1));
    } else if (item.get(pair) == simdjson::SUCCESS && pair.size() == 2) {
      std::string_view a, b;
      if (pair.at(0).get(a) != simdjson::SUCCESS || pair.at(1).get(b) != simdjson::SUCCESS) {
        return Status::InvalidArgument("tokenizer.json: bad merge");
      }
      left = std::string(a);
      right = std::string(b);
    } else {
      return Status::InvalidArgument("tokenizer.json: bad merge");
    }
    auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || m == vocab.end()) {
      return Status::InvalidArgument(fmt::format("{}: merge '{} {}' names a token not in the vocab",
                                                 path.string(), left, right));
    }
    const uint64_t key =
        (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    merges.emplace(key, std::make_pair(rank++, m->second));
  }
  SLUICE_RETURN_IF_ERROR(LoadPreTokenizer(root["pre_tokenizer"]));
  simdjson::dom::array single;
  if (root["post_processor"]["single"].get(single) == simdjson::SUCCESS) {
    bool after_sequence = false;
    for (auto item : single) {
      std::string_view token;
      if (item["SpecialToken"]["id"].get(token) == simdjson::SUCCESS) {
        auto it = vocab.find(std::string(token));
        if (it == vocab.end())
          return Status::InvalidArgument("tokenizer.json: unknown post-processor token");
        (after_sequence ? suffix : prefix).push_back(it->second);
      } else {
        after_sequence = true;
      }
    }
  }

  // tokenizer_config.json: bos/eos tokens (strings or {"content": ...}) and the chat template.
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    // On demand: these files carry integers simdjson's DOM rejects (model_max_length = 1e30),
    // which on-demand parsing never touches.
    simdjson::ondemand::parser config_parser;
    simdjson::padded_string text;
    simdjson::ondemand::document config;
    if (simdjson::padded_string::load(config_path.string()).get(text) != simdjson::SUCCESS ||
        config_parser.iterate(text).get(config) != simdjson::SUCCESS) {
      return Status::InvalidArgument(
          fmt::format("{}: cannot read it as JSON", config_path.string()));
    }
    auto token_of = [&](const char* key) -> std::string {
      simdjson::ondemand::value value;
      if (config.find_field_unordered(key).get(value) != simdjson::SUCCESS) return "";
      std::string_view text_value;
      if (value.get_string().get(text_value) == simdjson::SUCCESS) return std::string(text_value);
      simdjson::ondemand::object object;
      if (value.get_object().get(object) == simdjson::SUCCESS &&
          object.find_field_unordered("content").get_string().get(text_value) ==
              simdjson::SUCCESS) {
        return std::string(text_value);
      }
      return "";
    };
    bos = token_of("bos_token");
    eos = token_of("eos_token");
    std::string_view template_text;
    if (config.find_field_unordered("chat_template").get_string().get(template_text) ==
        simdjson::SUCCESS) {
      chat_template = std::string(template_text);
    }
  }
  if (chat_template.empty() && fs::exists(fs::path(dir) / "chat_template.jinja", ec)) {
    chat_template = ReadFile(fs::path(dir) / "chat_template.jinja");
  }
  return Status::Ok();
}

// Applies the pre-tokenizer steps in turn; each step splits every piece the previous one made.
void Tokenizer::Impl::Split(std::string_view text, std::vector<std::string_view>& pieces) const {
  std::vector<std::string_view> current{text}, next;
  pcre2_match_data* match = nullptr;
  for (const PreTokenizerStep& step : steps) {
    if (!step.regex) continue;
    if (match == nullptr) match = pcre2_match_data_create(4, nullptr);
    next.clear();
    for (std::string_view piece : current) {
      size_t offset = 0, last = 0;
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      while (offset < piece.size()) {
        const int rc = pcre2_match(step.regex->code, subject, piece.size(), offset,
                                   PCRE2_NO_UTF_CHECK, match, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
        const size_t begin = ovector[0], end = ovector[1];
        if (begin > last) next.push_back(piece.substr(last, begin - last));
        if (end > begin && step.kind == PreTokenizerStep::kIsolate) {
          next.push_back(piece.substr(begin, end - begin));
        }
        last = end;
        if (end == begin) {  // An empty match: step over one character.
          offset = end + 1;
          while (offset < piece.size() &&
                 (static_cast<unsigned char>(piece[offset]) & 0xC0) == 0x80)
            ++offset;
        } else {
          offset = end;
        }
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    current.swap(next);
  }
  if (match != nullptr) pcre2_match_data_free(match);
  for (std::string_view piece : current) {
    if (!piece.empty()) pieces.push_back(piece);
  }
}

// BPE on one pre-tokenized piece: start from its bytes, merge the lowest-ranked adjacent pair
// until none is left (a heap of candidate pairs over a linked list: n log n).
void Tokenizer::Impl::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const int32_t id = byte_ids[static_cast<unsigned char>(word[i])];
    if (id < 0) continue;  // A byte the vocab lacks: dropped (the tokenizers package does too).
    const int n = static_cast<int>(symbols.size());
    symbols.push_back({id, n - 1, n + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  struct Candidate {
    int32_t rank;
    int left;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const int32_t a = symbols[static_cast<size_t>(left)].id,
                  b = symbols[static_cast<size_t>(right)].id;
    auto it = merges.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    if (it != merges.end()) heap.push({it->second.first, left, a, b});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    if (left.id != c.left_id || left.next < 0) continue;  // Stale.
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    if (right.id != c.right_id) continue;
    left.id =
        merges.at((static_cast<uint64_t>(c.left_id) << 32) | static_cast<uint32_t>(c.right_id))
            .second;
    right.id = -1;  // Removed.
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
    ids.push_back(symbols[static_cast<size_t>(i)].id);
}

void Tokenizer::Impl::EncodeText(std::string_view text, std::vector<int32_t>& ids) const {
  std::string prefixed;
  for (const PreTokenizerStep& step : steps) {
    if (step.add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed.assign(1, ' ').append(text);
      text = prefixed;
      break;
    }
  }
  std::vector<std::string_view> pieces;
  Split(text, pieces);
  for (std::string_view piece : pieces) EncodeWord(piece, ids);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  SLUICE_RETURN_IF_ERROR(impl->Load(dir));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix;
  // Added tokens first: the earliest occurrence, the longest at one position (added is sorted
  // longest first). Each token's next occurrence is searched again only once it is passed.
  const auto& added = impl_->added;
  std::vector<size_t> next(added.size(), 0);
  for (size_t i = 0; i < added.size(); ++i) next[i] = text.find(added[i].first);
  size_t begin = 0;
  while (begin < text.size()) {
    size_t found = std::string_view::npos, match = 0;
    for (size_t i = 0; i < added.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < begin) {
        next[i] = text.find(added[i].first, begin);
      }
      if (next[i] < found) {
        found = next[i];
        match = i;
      }
    }
    if (found == std::string_view::npos) {
      impl_->EncodeText(text.substr(begin), ids);
      break;
    }
    if (found > begin) impl_->EncodeText(text.substr(begin, found - begin), ids);
    ids.push_back(added[match].second);
    begin = found + added[match].first.size();
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && IsSpecial(id)) continue;
    bytes += TokenBytes(id);
  }
  return Utf8Lossy(bytes);
}

const std::string& Tokenizer::TokenBytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) return kEmpty;
  return impl_->id_bytes[static_cast<size_t>(id)];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<size_t>(id)];
}

int32_t Tokenizer::TokenId(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->id_bytes.size()); }
const std::string& Tokenizer::bos_token() const { return impl_->bos; }
const std::string& Tokenizer::eos_token() const { return impl_->eos; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return "";
  pending_ += tokenizer_.TokenBytes(id);
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = SequenceLength(bytes.substr(i));
    if (len < 0) return i;  // Unfinished character at the end.
    i += len == 0 ? 1 : static_cast<size_t>(len);
  }
  return i;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int len = SequenceLength(bytes.substr(i));
    if (len > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      // Like from_utf8_lossy: a maximal invalid prefix of a sequence becomes one U+FFFD.
      size_t skip = 1;
      while (i + skip < bytes.size() && skip < 4 &&
             (static_cast<unsigned char>(bytes[i + skip]) & 0xC0) == 0x80 && len < 0) {
        ++skip;
      }
      i += len < 0 ? bytes.size() - i : skip;
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const int len = SequenceLength(bytes.substr(i));
    if (len <= 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

}  // namespace sluice::llm
