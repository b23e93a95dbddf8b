#include "llm/text/tool_calls.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <random>

#include "common/json_writer.h"

namespace sluice::llm {
namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kMistralOpen = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kDeepSeekOpen = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDeepSeekClose = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDeepSeekCall = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDeepSeekCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDeepSeekSep = "<｜tool▁sep｜>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

std::string_view Trim(std::string_view text) {
  while (!text.empty() && IsSpace(text.front())) text.remove_prefix(1);
  while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
  return text;
}

// The longest tail of `text` that is a proper start of `tag`.
size_t PartialTag(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(tag.size() - 1, text.size()); n > 0; --n) {
    if (text.substr(text.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// {"name": string, "arguments" (or Llama's "parameters"): an object, or a string holding one}.
std::optional<ToolCall> CallFrom(simdjson::dom::element element) {
  simdjson::dom::object object;
  std::string_view name;
  if (element.get(object) != simdjson::SUCCESS || object["name"].get(name) != simdjson::SUCCESS ||
      name.empty()) {
    return std::nullopt;
  }
  simdjson::dom::element arguments;
  if (object["arguments"].get(arguments) != simdjson::SUCCESS &&
      object["parameters"].get(arguments) != simdjson::SUCCESS) {
    return std::nullopt;
  }
  ToolCall call;
  call.id = NewToolCallId();
  call.name = std::string(name);
  std::string_view text;
  if (arguments.get(text) == simdjson::SUCCESS) {
    simdjson::dom::parser parser;
    simdjson::dom::element inner;
    if (parser.parse(std::string(text)).get(inner) != simdjson::SUCCESS || !inner.is_object()) {
      return std::nullopt;
    }
    call.arguments = simdjson::minify(inner);
  } else if (arguments.is_object()) {
    call.arguments = simdjson::minify(arguments);
  } else {
    return std::nullopt;
  }
  return call;
}

std::optional<ToolCall> ParseCall(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.parse(std::string(Trim(json))).get(root) != simdjson::SUCCESS) return std::nullopt;
  return CallFrom(root);
}

// The pythonic form some models answer in (Llama 3.2's and Llama 4's pythonic templates, Gemma
// fine-tunes): [name(key=value, ...), ...], the values Python literals (strings in either quote,
// numbers, True / False / None, lists, dicts). Empty where the text is not wholly that.
class PythonicReader {
 public:
  explicit PythonicReader(std::string_view text) : text_(text) {}

  std::vector<ToolCall> Calls() {
    std::vector<ToolCall> calls;
    if (!Accept('[')) return {};
    do {
      std::string name = Identifier();
      if (name.empty() || !Accept('(')) return {};
      JsonWriter arguments;
      arguments.BeginObject();
      if (!Accept(')')) {
        do {
          std::string key = Identifier();
          if (key.empty() || !Accept('=')) return {};
          arguments.Key(key);
          if (!Literal(arguments)) return {};
        } while (Accept(','));
        if (!Accept(')')) return {};
      }
      arguments.EndObject();
      calls.push_back(ToolCall{NewToolCallId(), std::move(name), arguments.str()});
    } while (Accept(','));
    if (!Accept(']')) return {};
    Skip();
    return pos_ == text_.size() ? calls : std::vector<ToolCall>();
  }

 private:
  void Skip() {
    while (pos_ < text_.size() && IsSpace(text_[pos_])) ++pos_;
  }
  bool Accept(char c) {
    Skip();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  std::string Identifier() {
    Skip();
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_' ||
            text_[pos_] == '-' || (pos_ > start && text_[pos_] == '.'))) {
      ++pos_;
    }
    return std::string(text_.substr(start, pos_ - start));
  }
  // A quoted string (either quote) at the position; false where there is none.
  bool StringLiteral(std::string& value) {
    Skip();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return false;
    const char quote = text_[pos_];
    for (++pos_; pos_ < text_.size() && text_[pos_] != quote; ++pos_) {
      if (text_[pos_] == '\\' && pos_ + 1 < text_.size()) {
        const char e = text_[++pos_];
        value += e == 'n' ? '\n' : e == 't' ? '\t' : e;
      } else {
        value += text_[pos_];
      }
    }
    if (pos_ >= text_.size()) return false;
    ++pos_;
    return true;
  }

  // One literal, written to `json` as JSON; false where it is none.
  bool Literal(JsonWriter& json, int depth = 0) {
    Skip();
    if (pos_ >= text_.size() || depth > 32) return false;
    const char c = text_[pos_];
    if (c == '\'' || c == '"') {
      std::string value;
      if (!StringLiteral(value)) return false;
      json.String(value);
      return true;
    }
    if (c == '[') {
      ++pos_;
      json.BeginArray();
      if (!Accept(']')) {
        do {
          if (!Literal(json, depth + 1)) return false;
        } while (Accept(','));
        if (!Accept(']')) return false;
      }
      json.EndArray();
      return true;
    }
    if (c == '{') {
      ++pos_;
      json.BeginObject();
      if (!Accept('}')) {
        do {
          std::string key;
          if (!StringLiteral(key)) return false;
          json.Key(key);
          if (!Accept(':') || !Literal(json, depth + 1)) return false;
        } while (Accept(','));
        if (!Accept('}')) return false;
      }
      json.EndObject();
      return true;
    }
    const size_t start = pos_;
    while (pos_ < text_.size() &&
           (std::isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '.' ||
            text_[pos_] == '-' || text_[pos_] == '+')) {
      ++pos_;
    }
    const std::string_view word = text_.substr(start, pos_ - start);
    if (word == "True" || word == "False") {
      json.Bool(word == "True");
    } else if (word == "None") {
      json.Null();
    } else {
      char* end = nullptr;
      const std::string number(word);
      const double value = std::strtod(number.c_str(), &end);
      if (number.empty() || end != number.c_str() + number.size()) return false;
      if (number.find_first_of(".eE") == std::string::npos) {
        json.Int(static_cast<int64_t>(std::strtoll(number.c_str(), nullptr, 10)));
      } else {
        json.Double(value);
      }
    }
    return true;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

std::vector<ToolCall> PythonicCalls(std::string_view text) {
  return PythonicReader(Trim(text)).Calls();
}

// What may open a call in the JSON fallback: Granite's marker, a Markdown fence.
constexpr std::string_view kJsonMarkers[] = {"<|tool_call|>", "```json", "```"};

// `text` after leading whitespace and JSON markers.
std::string_view AfterJsonMarkers(std::string_view text) {
  for (bool again = true; again;) {
    again = false;
    text = Trim(text);
    for (std::string_view marker : kJsonMarkers) {
      if (text.substr(0, marker.size()) == marker) {
        text.remove_prefix(marker.size());
        again = true;
        break;
      }
    }
  }
  return text;
}

// Whether `text` may yet become a marker (a proper start of one).
bool IsMarkerStart(std::string_view text) {
  for (std::string_view marker : kJsonMarkers) {
    if (text.size() < marker.size() && marker.substr(0, text.size()) == text) return true;
  }
  return false;
}

// Mistral's newer format (its v11 tokenizer's templates): name[ARGS]{...}, calls after the first
// each opened by [TOOL_CALLS] again. Empty where any piece does not parse.
std::vector<ToolCall> MistralNamedCalls(std::string_view body) {
  std::vector<ToolCall> calls;
  while (!Trim(body).empty()) {
    size_t next = body.find(kMistralOpen);
    std::string_view piece = body.substr(0, next);
    body = next == std::string_view::npos ? std::string_view()
                                          : body.substr(next + kMistralOpen.size());
    const size_t args = piece.find(kMistralArgs);
    if (args == std::string_view::npos) return {};
    std::string_view name = Trim(piece.substr(0, args));
    // Mistral Small 3.2's templates put the call's id between: name[CALL_ID]id[ARGS]{...}.
    if (const size_t id = name.find("[CALL_ID]"); id != std::string_view::npos) {
      name = Trim(name.substr(0, id));
    }
    simdjson::dom::parser parser;
    simdjson::dom::element arguments;
    if (name.empty() ||
        parser.parse(std::string(Trim(piece.substr(args + kMistralArgs.size())))).get(arguments) !=
            simdjson::SUCCESS ||
        !arguments.is_object()) {
      return {};
    }
    calls.push_back(ToolCall{NewToolCallId(), std::string(name), simdjson::minify(arguments)});
  }
  return calls;
}

// DeepSeek's calls after their opening marker: each <｜tool▁call▁begin｜>[function<｜tool▁sep｜>]
// name, then its arguments (in a ```json fence in R1's form, bare after the separator in
// V3.1's), then <｜tool▁call▁end｜>. Empty where any call does not parse.
std::vector<ToolCall> DeepSeekCalls(std::string_view body) {
  if (const size_t close = body.find(kDeepSeekClose); close != std::string_view::npos) {
    if (!Trim(body.substr(close + kDeepSeekClose.size())).empty()) return {};
    body = body.substr(0, close);
  }
  std::vector<ToolCall> calls;
  while (!Trim(body).empty()) {
    body = Trim(body);
    if (body.substr(0, kDeepSeekCall.size()) != kDeepSeekCall) return {};
    body.remove_prefix(kDeepSeekCall.size());
    const size_t end = body.find(kDeepSeekCallEnd);
    if (end == std::string_view::npos) return {};
    std::string_view call = body.substr(0, end);
    body.remove_prefix(end + kDeepSeekCallEnd.size());
    const size_t sep = call.find(kDeepSeekSep);
    if (sep == std::string_view::npos) return {};
    std::string_view name = Trim(call.substr(0, sep));
    std::string_view arguments = call.substr(sep + kDeepSeekSep.size());
    if (name == "function") {  // R1's form: the name, then the arguments in a fence.
      const size_t line = arguments.find('\n');
      if (line == std::string_view::npos) return {};
      name = Trim(arguments.substr(0, line));
      arguments = Trim(arguments.substr(line + 1));
      if (arguments.substr(0, 7) == "```json") arguments.remove_prefix(7);
      arguments = Trim(arguments);
      if (arguments.size() >= 3 && arguments.substr(arguments.size() - 3) == "```") {
        arguments.remove_suffix(3);
      }
    }
    simdjson::dom::parser parser;
    simdjson::dom::element object;
    if (name.empty() ||
        parser.parse(std::string(Trim(arguments))).get(object) != simdjson::SUCCESS ||
        !object.is_object()) {
      return {};
    }
    calls.push_back(ToolCall{NewToolCallId(), std::string(name), simdjson::minify(object)});
  }
  return calls;
}

}  // namespace

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kDeepSeek:
      return "deepseek";
    case ToolCallFormat::kJson:
      return "json";
    case ToolCallFormat::kHarmony:
      return "harmony";
    case ToolCallFormat::kUnknown:
      break;
  }
  return "unknown";
}

ToolCallFormat ToolCallFormatOf(std::string_view source) {
  if (source.find("<|channel|>") != std::string_view::npos &&
      source.find("<|call|>") != std::string_view::npos) {
    return ToolCallFormat::kHarmony;
  }
  if (source.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (source.find(kMistralOpen) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (source.find(kDeepSeekOpen) != std::string_view::npos) return ToolCallFormat::kDeepSeek;
  if (source.find("\"parameters\"") != std::string_view::npos ||
      source.find(kPythonTag) != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  // A template that knows tools but writes calls in no format above: the JSON fallback.
  if (source.find("tool") != std::string_view::npos) return ToolCallFormat::kJson;
  return ToolCallFormat::kUnknown;
}

std::string NewToolCallId(ToolCallFormat format) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 random{std::random_device{}()};
  const bool mistral = format == ToolCallFormat::kMistral;
  std::string id = mistral ? "" : "call_";
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  for (int i = 0; i < (mistral ? 9 : 24); ++i) id += kAlphabet[pick(random)];
  return id;
}

Result<std::vector<ToolCall>> ParseToolCallArray(std::string_view json) {
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  simdjson::dom::array array;
  if (parser.parse(std::string(Trim(json))).get(root) != simdjson::SUCCESS ||
      root.get(array) != simdjson::SUCCESS || array.size() == 0) {
    return Status::InvalidArgument("the reply is not a non-empty JSON array of tool calls");
  }
  std::vector<ToolCall> calls;
  for (simdjson::dom::element item : array) {
    std::optional<ToolCall> call = CallFrom(item);
    if (!call) {
      return Status::InvalidArgument(
          fmt::format("tool call {} is not an object with 'name' and 'arguments'", calls.size()));
    }
    calls.push_back(std::move(*call));
  }
  return calls;
}

std::vector<ToolCall> CompleteToolCalls(std::string_view json) {
  json = Trim(json);
  std::vector<ToolCall> calls;
  if (json.empty() || json.front() != '[') return calls;
  // Depth and strings tracked byte by byte: an element ends where the depth comes back to the
  // array's own at a ',' or ']'.
  int depth = 0;
  bool in_string = false, escaped = false;
  size_t start = 1;
  for (size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
    if (depth == 1 && c == ',') {
      std::optional<ToolCall> call = ParseCall(json.substr(start, i - start));
      if (!call) break;
      calls.push_back(std::move(*call));
      start = i + 1;
    } else if (depth == 0) {  // The array's close.
      if (std::optional<ToolCall> call = ParseCall(json.substr(start, i - start))) {
        calls.push_back(std::move(*call));
      }
      break;
    }
  }
  return calls;
}

void ToolCallParser::Release(Pieces& out, std::string text) {
  if (after_call_) {
    const size_t start = text.find_first_not_of(" \n\t\r");
    if (start == std::string::npos) return;
    text.erase(0, start);
    after_call_ = false;
  }
  out.content += text;
}

void ToolCallParser::Hermes(Pieces& out, bool end) {
  for (;;) {
    if (!in_call_) {
      const size_t open = buffer_.find(kHermesOpen);
      if (open != std::string::npos) {
        Release(out, buffer_.substr(0, open));
        buffer_.erase(0, open + kHermesOpen.size());
        in_call_ = true;
        continue;
      }
      const size_t hold = end ? 0 : PartialTag(buffer_, kHermesOpen);
      Release(out, buffer_.substr(0, buffer_.size() - hold));
      buffer_.erase(0, buffer_.size() - hold);
      return;
    }
    const size_t close = buffer_.find(kHermesClose);
    if (close == std::string::npos && !end) return;
    const bool closed = close != std::string::npos;
    const std::string body = closed ? buffer_.substr(0, close) : buffer_;
    buffer_.erase(0, closed ? close + kHermesClose.size() : buffer_.size());
    in_call_ = false;
    if (std::optional<ToolCall> call = ParseCall(body)) {
      out.calls.push_back(std::move(*call));
      after_call_ = true;
    } else {
      Release(out, std::string(kHermesOpen) + body + (closed ? std::string(kHermesClose) : ""));
    }
    if (!closed) return;
  }
}

void ToolCallParser::Whole(Pieces& out, bool end) {
  const bool mistral = format_ == ToolCallFormat::kMistral;
  const bool deepseek = format_ == ToolCallFormat::kDeepSeek;
  // Mistral's and DeepSeek's calls follow their marker, wherever in the reply it comes.
  const std::string_view marker = deepseek ? kDeepSeekOpen : kMistralOpen;
  if (!in_call_ && !started_) {
    if (mistral || deepseek) {
      const size_t open = buffer_.find(marker);
      if (open != std::string::npos) {
        Release(out, buffer_.substr(0, open));
        buffer_.erase(0, open + marker.size());
        in_call_ = true;
      } else {
        const size_t hold = end ? 0 : PartialTag(buffer_, marker);
        Release(out, buffer_.substr(0, buffer_.size() - hold));
        buffer_.erase(0, buffer_.size() - hold);
        return;
      }
    } else if (format_ == ToolCallFormat::kJson) {
      // A call is the whole reply, after a marker or a fence where there is one.
      const std::string_view rest = AfterJsonMarkers(buffer_);
      if (rest.empty() || (!end && (IsMarkerStart(rest) || IsMarkerStart(Trim(buffer_))))) {
        if (end) Release(out, std::exchange(buffer_, {}));
        return;
      }
      if (rest.front() == '{' || rest.front() == '[') {
        in_call_ = true;
      } else {
        started_ = true;
      }
    } else {
      // Llama 3: a call is the whole reply, so it can only open it.
      if (buffer_.compare(0, kPythonTag.size(), kPythonTag) == 0) {
        buffer_.erase(0, kPythonTag.size());
      }
      const size_t first = buffer_.find_first_not_of(" \n\t\r");
      if (first == std::string::npos) {
        if (end) Release(out, std::exchange(buffer_, {}));
        return;
      }
      if (buffer_[first] == '{') {
        in_call_ = true;
      } else {
        started_ = true;
      }
    }
  }
  if (!in_call_) {
    Release(out, std::exchange(buffer_, {}));
    return;
  }
  if (!end) return;
  std::string body = std::exchange(buffer_, {});
  in_call_ = false;
  std::vector<ToolCall> calls;
  if (mistral) {
    if (auto parsed = ParseToolCallArray(body); parsed.ok()) {
      calls = std::move(*parsed);
    } else {
      calls = MistralNamedCalls(body);
    }
  } else if (deepseek) {
    calls = DeepSeekCalls(body);
  } else if (format_ == ToolCallFormat::kJson) {
    std::string_view json = AfterJsonMarkers(body);
    // The fence's close, or Phi-4-mini's <|/tool_call|>.
    for (const std::string_view close :
         {std::string_view("```"), std::string_view("<|/tool_call|>")}) {
      json = Trim(json);
      if (json.size() >= close.size() && json.substr(json.size() - close.size()) == close) {
        json.remove_suffix(close.size());
      }
    }
    if (auto parsed = ParseToolCallArray(json); parsed.ok()) {
      calls = std::move(*parsed);
    } else if (std::optional<ToolCall> call = ParseCall(json)) {
      calls.push_back(std::move(*call));
    } else {
      calls = PythonicCalls(json);
    }
  } else {
    // One object, or several joined by ';'.
    size_t start = 0;
    while (start <= body.size()) {
      size_t next = body.find(';', start);
      if (next == std::string::npos) next = body.size();
      const std::string_view piece = std::string_view(body).substr(start, next - start);
      start = next + 1;
      if (Trim(piece).empty()) continue;
      std::optional<ToolCall> call = ParseCall(piece);
      if (!call) {
        // A ';' inside a string: the whole text as one call, or no call at all.
        calls.clear();
        if (std::optional<ToolCall> whole = ParseCall(body)) calls.push_back(std::move(*whole));
        break;
      }
      calls.push_back(std::move(*call));
    }
  }
  if (calls.empty()) {
    Release(out, (mistral || deepseek ? std::string(marker) : std::string()) + body);
    return;
  }
  for (ToolCall& call : calls) out.calls.push_back(std::move(call));
  after_call_ = true;
}

ToolCallParser::Pieces ToolCallParser::Add(std::string_view text) {
  Pieces out;
  buffer_ += text;
  if (format_ == ToolCallFormat::kHermes) {
    Hermes(out, /*end=*/false);
  } else if (format_ == ToolCallFormat::kUnknown) {
    Release(out, std::exchange(buffer_, {}));
  } else {
    Whole(out, /*end=*/false);
  }
  return out;
}

ToolCallParser::Pieces ToolCallParser::Finish() {
  Pieces out;
  if (format_ == ToolCallFormat::kHermes) {
    Hermes(out, /*end=*/true);
  } else if (format_ == ToolCallFormat::kUnknown) {
    Release(out, std::exchange(buffer_, {}));
  } else {
    Whole(out, /*end=*/true);
  }
  return out;
}

}  // namespace sluice::llm
