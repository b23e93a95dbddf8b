// The fields every request parser reads (the OpenAI, Responses and Anthropic fronts): numbers,
// integers, strings and booleans with their ranges, and keys refused by name. Every error names
// the request parameter at fault.
#pragma once

#include <simdjson.h>

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "common/json_writer.h"
#include "llm/generation_service.h"

namespace sluice::fields {

struct ParseError {
  std::string message;
  std::string param;  // The request parameter at fault; "" for the body as a whole.
};

using simdjson::dom::element;

// root[key] in [low, high] when present and not null (else `out` unchanged); an integer is a
// number too.
std::optional<ParseError> ReadNumber(const element& root, const char* key, double low, double high,
                                     double& out);
std::optional<ParseError> ReadInt(const element& root, const char* key, int64_t low, int64_t high,
                                  int64_t& out);
std::optional<ParseError> ReadString(const element& root, const char* key, std::string& out);
std::optional<ParseError> ReadBool(const element& root, const char* key, bool& out);
// Ollama's keep_alive: a number of seconds or a duration string ("10m", "1h30m"; negative keeps
// the model loaded, 0 unloads it once idle).
std::optional<ParseError> ReadKeepAlive(const element& root, const char* key,
                                        std::optional<std::chrono::milliseconds>& out);
// `body` as a JSON object, parsed into `parser`'s memory.
std::optional<ParseError> ParseObject(simdjson::dom::parser& parser, std::string_view body,
                                      element& root);
// The first key of `root` outside `known`, refused by name: "'key' is not a parameter of this
// route", or with `prefix` (a nested object's path, "tools[0]."), "'prefix.key' is not
// supported" naming the parameter the path starts with.
std::optional<ParseError> OnlyKeys(const element& root,
                                   std::initializer_list<std::string_view> known,
                                   std::string_view prefix = {});
// A function name as OpenAI allows it: 1-64 letters, digits, '_' or '-'.
bool ValidName(std::string_view name);

// A function tool's fields in `object`, as every front has them under its own names: `name`, a
// `description`, its arguments' JSON Schema under `schema_key` (required or not), `strict`
// (`strict` when not given). Checked (a name given twice is refused), added to `out`, and, where
// `definitions` is given, written to it in the chat shape every template reads ({"type":
// "function", "function": {"name", "description", "parameters"}}). `where` names the object in
// errors, whose parameter is "tools".
std::optional<ParseError> ReadFunction(const element& object, const char* schema_key,
                                       bool schema_required, bool strict, const std::string& where,
                                       llm::ToolOptions& out, JsonWriter* definitions);

// tool_choice's words as OpenAI's fronts spell them: "auto", "none", "required" (false for any
// other word).
bool ChoiceWord(std::string_view word, llm::ToolOptions::Choice& out);
// tool_choice naming a function: it must be among the tools.
std::optional<ParseError> ChooseFunction(std::string_view name, llm::ToolOptions& out);
// A choice that asks for a call needs tools.
std::optional<ParseError> ChoiceNeedsTools(const llm::ToolOptions& tools);

}  // namespace sluice::fields
