#include "http/request_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/duration.h"

namespace sluice::fields {

std::optional<ParseError> ReadNumber(const element& root, const char* key, double low, double high,
                                     double& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  double number = 0;
  int64_t integer = 0;
  if (value.get(number) != simdjson::SUCCESS) {
    if (value.get(integer) != simdjson::SUCCESS)
      return ParseError{fmt::format("'{}' must be a number", key), key};
    number = static_cast<double>(integer);
  }
  if (!(number >= low && number <= high)) {
    return ParseError{fmt::format("'{}' is {}; it must lie in [{}, {}]", key, number, low, high),
                      key};
  }
  out = number;
  return std::nullopt;
}

std::optional<ParseError> ReadInt(const element& root, const char* key, int64_t low, int64_t high,
                                  int64_t& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  int64_t number = 0;
  if (value.get(number) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be an integer", key), key};
  }
  if (number < low || number > high) {
    return ParseError{fmt::format("'{}' is {}; it must lie in [{}, {}]", key, number, low, high),
                      key};
  }
  out = number;
  return std::nullopt;
}

bool ValidName(std::string_view name) {
  return !name.empty() && name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
}

std::optional<ParseError> ParseObject(simdjson::dom::parser& parser, std::string_view body,
                                      element& root) {
  if (parser.parse(body.data(), body.size()).get(root) != simdjson::SUCCESS || !root.is_object()) {
    return ParseError{"the body is not a JSON object", ""};
  }
  return std::nullopt;
}

std::optional<ParseError> ReadString(const element& root, const char* key, std::string& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  std::string_view text;
  if (value.get(text) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be a string", key), key};
  }
  out = std::string(text);
  return std::nullopt;
}

std::optional<ParseError> ReadBool(const element& root, const char* key, bool& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  if (value.get(out) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be true or false", key), key};
  }
  return std::nullopt;
}

std::optional<ParseError> ReadKeepAlive(const element& root, const char* key,
                                        std::optional<std::chrono::milliseconds>& out) {
  element value;
  if (root[key].get(value) != simdjson::SUCCESS || value.is_null()) return std::nullopt;
  std::string text;
  double seconds = 0;
  int64_t integer = 0;
  std::string_view string;
  if (value.get(string) == simdjson::SUCCESS) {
    text = std::string(string);
  } else if (value.get(integer) == simdjson::SUCCESS) {
    text = std::to_string(integer);
  } else if (value.get(seconds) == simdjson::SUCCESS) {
    text = fmt::format("{}", seconds);
  } else {
    return ParseError{fmt::format("'{}' must be a number of seconds or a duration such as \"10m\"",
                                  key),
                      key};
  }
  auto parsed = ParseDuration(text);
  if (!parsed.ok()) return ParseError{fmt::format("'{}': {}", key, parsed.status().message()), key};
  out = *parsed;
  return std::nullopt;
}

std::optional<ParseError> OnlyKeys(const element& root,
                                   std::initializer_list<std::string_view> known,
                                   std::string_view prefix) {
  simdjson::dom::object object;
  if (root.get(object) != simdjson::SUCCESS) return ParseError{"the body is not a JSON object", ""};
  for (auto field : object) {
    if (std::find(known.begin(), known.end(), field.key) == known.end()) {
      if (prefix.empty()) {
        return ParseError{fmt::format("'{}' is not a parameter of this route", field.key),
                          std::string(field.key)};
      }
      return ParseError{fmt::format("'{}{}' is not supported", prefix, field.key),
                        std::string(prefix.substr(0, prefix.find_first_of(".[")))};
    }
  }
  return std::nullopt;
}

std::optional<ParseError> ReadFunction(const element& object, const char* schema_key,
                                       bool schema_required, bool strict, const std::string& where,
                                       llm::ToolOptions& out, JsonWriter* definitions) {
  llm::ToolFunction f;
  std::string_view name, description;
  if (object["name"].get(name) != simdjson::SUCCESS || !ValidName(name)) {
    return ParseError{fmt::format("'{}.name' must be 1-64 letters, digits, '_' or '-'", where),
                      "tools"};
  }
  f.name = std::string(name);
  for (const llm::ToolFunction& other : out.functions) {
    if (other.name == f.name) {
      return ParseError{fmt::format("two tools are named '{}'", f.name), "tools"};
    }
  }
  element value;
  if (object["description"].get(value) == simdjson::SUCCESS && !value.is_null() &&
      value.get(description) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}.description' must be a string", where), "tools"};
  }
  if (object[schema_key].get(value) == simdjson::SUCCESS && !value.is_null()) {
    if (!value.is_object()) {
      return ParseError{fmt::format("'{}.{}' must be a JSON Schema object", where, schema_key),
                        "tools"};
    }
    f.parameters = simdjson::minify(value);
  } else if (schema_required) {
    return ParseError{fmt::format("'{}.{}' (a JSON Schema object) is required", where, schema_key),
                      "tools"};
  }
  f.strict = strict;
  if (auto e = ReadBool(object, "strict", f.strict)) {
    return ParseError{fmt::format("'{}.strict' must be true or false", where), "tools"};
  }
  if (definitions != nullptr) {
    definitions->BeginObject().Field("type", "function").Key("function").BeginObject();
    definitions->Field("name", f.name);
    if (!description.empty()) definitions->Field("description", description);
    definitions->Key("parameters");
    if (f.parameters.empty()) {
      definitions->BeginObject().Field("type", "object").EndObject();
    } else {
      definitions->Raw(f.parameters);
    }
    definitions->EndObject().EndObject();
  }
  out.functions.push_back(std::move(f));
  return std::nullopt;
}

bool ChoiceWord(std::string_view word, llm::ToolOptions::Choice& out) {
  using Choice = llm::ToolOptions::Choice;
  if (word == "auto") {
    out = Choice::kAuto;
  } else if (word == "none") {
    out = Choice::kNone;
  } else if (word == "required") {
    out = Choice::kRequired;
  } else {
    return false;
  }
  return true;
}

std::optional<ParseError> ChooseFunction(std::string_view name, llm::ToolOptions& out) {
  const bool known = std::any_of(out.functions.begin(), out.functions.end(),
                                 [&](const llm::ToolFunction& f) { return f.name == name; });
  if (!known) {
    return ParseError{fmt::format("'tool_choice' names '{}', which is not among 'tools'", name),
                      "tool_choice"};
  }
  out.choice = llm::ToolOptions::Choice::kFunction;
  out.function = std::string(name);
  return std::nullopt;
}

std::optional<ParseError> ChoiceNeedsTools(const llm::ToolOptions& tools) {
  if (tools.functions.empty() && (tools.choice == llm::ToolOptions::Choice::kRequired ||
                                  tools.choice == llm::ToolOptions::Choice::kFunction)) {
    return ParseError{"a 'tool_choice' that asks for a call needs 'tools'", "tool_choice"};
  }
  return std::nullopt;
}

}  // namespace sluice::fields
