#include "http/responses_request.h"

#include <fmt/format.h>
#include <simdjson.h>

#include "common/json_writer.h"
#include "http/llm_front.h"

namespace sluice::responses {
namespace {

using fields::OnlyKeys;
using fields::ParseObject;
using fields::ReadBool;
using fields::ReadInt;
using fields::ReadNumber;
using fields::ReadString;
using fields::ValidName;
using simdjson::dom::element;

// A message's content: a string, or parts of which input_text, output_text and refusal are
// text (joined); images and files are refused.
std::optional<ParseError> ReadContent(const element& content, const std::string& where,
                                      std::string& out) {
  std::string_view text;
  if (content.get(text) == simdjson::SUCCESS) {
    out = std::string(text);
    return std::nullopt;
  }
  simdjson::dom::array parts;
  if (content.get(parts) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be a string or an array of content parts", where),
                      "input"};
  }
  size_t index = 0;
  for (element part : parts) {
    const std::string at = fmt::format("{}[{}]", where, index++);
    std::string_view type;
    if (!part.is_object() || part["type"].get(type) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'{}' must be a part with a string 'type'", at), "input"};
    }
    if (type == "input_text" || type == "output_text") {
      if (auto e = OnlyKeys(part, {"type", "text", "annotations", "logprobs"}, at + ".")) return e;
      if (part["text"].get(text) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}.text' must be a string", at), "input"};
      }
    } else if (type == "refusal") {
      if (auto e = OnlyKeys(part, {"type", "refusal"}, at + ".")) return e;
      if (part["refusal"].get(text) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}.refusal' must be a string", at), "input"};
      }
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      return ParseError{
          fmt::format("'{}' is an {} part: Sluice's language models read text only", at, type),
          "input"};
    } else {
      return ParseError{fmt::format("'{}': a part of type '{}' is not supported", at, type),
                        "input"};
    }
    out += text;
  }
  return std::nullopt;
}

// The assistant message the next output item (reasoning, function_call) belongs to: the last
// message when it is an assistant's that nothing of another kind followed; else a new one.
llm::ChatMessage& Assistant(std::vector<llm::ChatMessage>& out, bool for_reasoning) {
  if (!out.empty() && out.back().role == "assistant" &&
      (!for_reasoning || (out.back().content.empty() && out.back().tool_calls.empty()))) {
    return out.back();
  }
  llm::ChatMessage message;
  message.role = "assistant";
  out.push_back(std::move(message));
  return out.back();
}

std::optional<ParseError> ReadItems(const element& input, std::vector<llm::ChatMessage>& out,
                                    std::vector<std::string>& items_json) {
  std::string_view text;
  if (input.get(text) == simdjson::SUCCESS) {
    llm::ChatMessage message;
    message.role = "user";
    message.content = std::string(text);
    out.push_back(std::move(message));
    JsonWriter json;
    json.BeginObject().Field("id", RandomId("msg_")).Field("type", "message");
    json.Field("role", "user").Key("content").BeginArray();
    json.BeginObject().Field("type", "input_text").Field("text", text).EndObject();
    json.EndArray().EndObject();
    items_json.push_back(json.str());
    return std::nullopt;
  }
  simdjson::dom::array items;
  if (input.get(items) != simdjson::SUCCESS) {
    return ParseError{"'input' must be a string or an array of items", "input"};
  }
  size_t index = 0;
  for (element item : items) {
    const std::string at = fmt::format("input[{}]", index++);
    if (!item.is_object()) return ParseError{fmt::format("'{}' must be an object", at), "input"};
    std::string_view type = "message";
    element value;
    if (item["type"].get(value) == simdjson::SUCCESS && value.get(type) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'{}.type' must be a string", at), "input"};
    }
    // Listed as given, an id added where it has none, a message's text content as a part.
    std::string minified = simdjson::minify(item);
    std::string_view text_content, role;
    if (type == "message" && item["content"].get(text_content) == simdjson::SUCCESS &&
        item["role"].get(role) == simdjson::SUCCESS) {
      JsonWriter json;
      std::string_view given_id;
      json.BeginObject().Field("id", item["id"].get(given_id) == simdjson::SUCCESS
                                         ? std::string(given_id)
                                         : RandomId("msg_"));
      json.Field("type", "message").Field("role", role).Key("content").BeginArray();
      json.BeginObject().Field("type", role == "assistant" ? "output_text" : "input_text");
      json.Field("text", text_content).EndObject().EndArray().EndObject();
      minified = json.str();
    } else if (item["id"].get(value) != simdjson::SUCCESS && minified.size() > 2) {
      const std::string_view prefix = type == "function_call"          ? "fc_"
                                      : type == "function_call_output" ? "fco_"
                                      : type == "reasoning"            ? "rs_"
                                                                       : "msg_";
      minified.insert(1, fmt::format("\"id\":\"{}\",", RandomId(prefix)));
    }
    items_json.push_back(std::move(minified));
    if (type == "message") {
      if (auto e = OnlyKeys(item, {"type", "role", "content", "id", "status"}, at + ".")) {
        return e;
      }
      std::string_view role;
      if (item["role"].get(role) != simdjson::SUCCESS ||
          (role != "user" && role != "assistant" && role != "system" && role != "developer")) {
        return ParseError{
            fmt::format("'{}.role' must be \"user\", \"assistant\", \"system\" or \"developer\"",
                        at),
            "input"};
      }
      element content;
      if (item["content"].get(content) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}.content' is required", at), "input"};
      }
      std::string joined;
      if (auto e = ReadContent(content, at + ".content", joined)) return e;
      if (role == "assistant") {
        // After its reasoning (the item before), the same turn.
        llm::ChatMessage& message = Assistant(out, /*for_reasoning=*/true);
        message.content = std::move(joined);
      } else {
        llm::ChatMessage message;
        message.role = std::string(role);
        message.content = std::move(joined);
        out.push_back(std::move(message));
      }
    } else if (type == "function_call") {
      if (auto e =
              OnlyKeys(item, {"type", "call_id", "name", "arguments", "id", "status"}, at + ".")) {
        return e;
      }
      std::string_view call_id, name, arguments;
      if (item["call_id"].get(call_id) != simdjson::SUCCESS || call_id.empty() ||
          item["name"].get(name) != simdjson::SUCCESS ||
          item["arguments"].get(arguments) != simdjson::SUCCESS) {
        return ParseError{
            fmt::format("'{}' must hold strings 'call_id', 'name' and 'arguments'", at), "input"};
      }
      Assistant(out, /*for_reasoning=*/false)
          .tool_calls.push_back(
              llm::ToolCallRecord{std::string(call_id), std::string(name), std::string(arguments)});
    } else if (type == "function_call_output") {
      if (auto e = OnlyKeys(item, {"type", "call_id", "output", "id", "status"}, at + ".")) {
        return e;
      }
      llm::ChatMessage message;
      message.role = "tool";
      std::string_view call_id;
      element output;
      if (item["call_id"].get(call_id) != simdjson::SUCCESS || call_id.empty() ||
          item["output"].get(output) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}' must hold a string 'call_id' and its 'output'", at),
                          "input"};
      }
      message.tool_call_id = std::string(call_id);
      if (auto e = ReadContent(output, at + ".output", message.content)) return e;
      out.push_back(std::move(message));
    } else if (type == "reasoning") {
      if (auto e =
              OnlyKeys(item, {"type", "id", "summary", "content", "encrypted_content", "status"},
                       at + ".")) {
        return e;
      }
      if (item["encrypted_content"].get(value) == simdjson::SUCCESS && !value.is_null()) {
        return ParseError{fmt::format("'{}.encrypted_content' is another server's reasoning, "
                                      "which Sluice cannot read",
                                      at),
                          "input"};
      }
      std::string reasoning;
      simdjson::dom::array parts;
      if (item["content"].get(parts) == simdjson::SUCCESS) {
        for (element part : parts) {
          if (part["text"].get(text) != simdjson::SUCCESS) {
            return ParseError{fmt::format("'{}.content' must hold {{\"type\": \"reasoning_text\", "
                                          "\"text\"}} parts",
                                          at),
                              "input"};
          }
          reasoning += text;
        }
      }
      Assistant(out, /*for_reasoning=*/true).reasoning_content += reasoning;
    } else {
      return ParseError{
          fmt::format("'{}' is an item of type '{}', which is not supported", at, type), "input"};
    }
  }
  return std::nullopt;
}

// tools: [{"type": "function", "name", "description", "parameters", "strict"}], strict unless it
// says otherwise (as the Responses API has it). The template sees them in the chat shape.
std::optional<ParseError> ReadTools(const element& root, llm::ToolOptions& out, std::string& echo) {
  element tools;
  if (root["tools"].get(tools) != simdjson::SUCCESS || tools.is_null()) return std::nullopt;
  simdjson::dom::array list;
  if (tools.get(list) != simdjson::SUCCESS) return ParseError{"'tools' must be an array", "tools"};
  echo = simdjson::minify(tools);
  if (list.size() == 0) return std::nullopt;
  JsonWriter definitions;
  definitions.BeginArray();
  size_t index = 0;
  for (element tool : list) {
    const std::string where = fmt::format("tools[{}]", index++);
    std::string_view type;
    if (!tool.is_object() || tool["type"].get(type) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'{}' must be an object with a string 'type'", where), "tools"};
    }
    if (type != "function") {
      return ParseError{fmt::format("'{}' is a '{}' tool, which Sluice does not run; only "
                                    "'function' tools are served",
                                    where, type),
                        "tools"};
    }
    if (auto e =
            OnlyKeys(tool, {"type", "name", "description", "parameters", "strict"}, where + ".")) {
      return e;
    }
    // Strict unless it says otherwise, as the Responses API has its functions.
    if (auto e = fields::ReadFunction(tool, "parameters", /*schema_required=*/false,
                                      /*strict=*/true, where, out, &definitions)) {
      return e;
    }
  }
  definitions.EndArray();
  out.definitions = definitions.str();
  return std::nullopt;
}

std::optional<ParseError> ReadToolChoice(const element& root, llm::ToolOptions& out,
                                         std::string& echo) {
  constexpr const char* kParam = "tool_choice";
  element choice;
  if (root[kParam].get(choice) != simdjson::SUCCESS || choice.is_null()) return std::nullopt;
  echo = simdjson::minify(choice);
  std::string_view text;
  if (choice.get(text) == simdjson::SUCCESS) {
    if (!fields::ChoiceWord(text, out.choice)) {
      return ParseError{fmt::format("'tool_choice' '{}' is not one of \"auto\", \"none\", "
                                    "\"required\" or {{\"type\": \"function\", \"name\"}}",
                                    text),
                        kParam};
    }
  } else {
    std::string_view type, name;
    if (!choice.is_object() || choice["type"].get(type) != simdjson::SUCCESS) {
      return ParseError{"'tool_choice' must be a string or an object with a string 'type'", kParam};
    }
    if (type != "function") {
      return ParseError{
          fmt::format("'tool_choice' of type '{}' is not supported; name a function", type),
          kParam};
    }
    if (auto e = OnlyKeys(choice, {"type", "name"}, "tool_choice.")) return e;
    if (choice["name"].get(name) != simdjson::SUCCESS) {
      return ParseError{"'tool_choice.name' (a string) is required", kParam};
    }
    if (auto e = fields::ChooseFunction(name, out)) return e;
  }
  if (auto e = fields::ChoiceNeedsTools(out)) return e;
  return std::nullopt;
}

// text: {"format": {"type": "text" | "json_object" | "json_schema", "name", "schema", "strict",
// "description"}}.
std::optional<ParseError> ReadText(const element& root, llm::ResponseFormat& out,
                                   std::string& echo) {
  constexpr const char* kParam = "text";
  element text;
  if (root[kParam].get(text) != simdjson::SUCCESS || text.is_null()) return std::nullopt;
  if (!text.is_object()) return ParseError{"'text' must be an object", kParam};
  if (auto e = OnlyKeys(text, {"format"}, "text.")) return e;
  echo = simdjson::minify(text);
  element format;
  if (text["format"].get(format) != simdjson::SUCCESS || format.is_null()) return std::nullopt;
  std::string_view type;
  if (!format.is_object() || format["type"].get(type) != simdjson::SUCCESS) {
    return ParseError{"'text.format' must be an object with a string 'type'", kParam};
  }
  if (type == "text" || type == "json_object") {
    if (auto e = OnlyKeys(format, {"type"}, "text.format.")) return e;
    out.type =
        type == "text" ? llm::ResponseFormat::Type::kText : llm::ResponseFormat::Type::kJsonObject;
    return std::nullopt;
  }
  if (type != "json_schema") {
    return ParseError{fmt::format("'text.format.type' '{}' is not one of \"text\", "
                                  "\"json_object\" and \"json_schema\"",
                                  type),
                      kParam};
  }
  if (auto e =
          OnlyKeys(format, {"type", "name", "schema", "strict", "description"}, "text.format.")) {
    return e;
  }
  std::string_view name;
  if (format["name"].get(name) != simdjson::SUCCESS || !ValidName(name)) {
    return ParseError{"'text.format.name' must be 1-64 letters, digits, '_' or '-'", kParam};
  }
  element schema;
  if (format["schema"].get(schema) != simdjson::SUCCESS || !schema.is_object()) {
    return ParseError{"'text.format.schema' (a JSON Schema object) is required", kParam};
  }
  // strict false is served as true: a reply that always follows the schema is within it.
  bool strict = true;
  if (auto e = ReadBool(format, "strict", strict)) {
    return ParseError{"'text.format.strict' must be true or false", kParam};
  }
  out.type = llm::ResponseFormat::Type::kJsonSchema;
  out.schema = simdjson::minify(schema);
  return std::nullopt;
}

}  // namespace

std::optional<ParseError> ParseResponses(std::string_view body, ResponsesRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  r.chat = true;
  // Identifiers for the caller's own bookkeeping (user, safety_identifier) and cache routing
  // (prompt_cache_key: the prefix cache finds shared prefixes by itself) change nothing here.
  if (auto e = OnlyKeys(root, {"model",
                               "input",
                               "instructions",
                               "tools",
                               "tool_choice",
                               "parallel_tool_calls",
                               "text",
                               "max_output_tokens",
                               "temperature",
                               "top_p",
                               "reasoning",
                               "stream",
                               "stream_options",
                               "store",
                               "previous_response_id",
                               "metadata",
                               "user",
                               "safety_identifier",
                               "prompt_cache_key",
                               "truncation",
                               "include",
                               "background",
                               "service_tier"})) {
    return e;
  }
  if (auto e = ReadString(root, "model", r.model)) return e;
  element input;
  if (root["input"].get(input) != simdjson::SUCCESS || input.is_null()) {
    return ParseError{"'input' is required", "input"};
  }
  if (auto e = ReadItems(input, r.input, r.input_items)) return e;
  element value;
  if (root["instructions"].get(value) == simdjson::SUCCESS && !value.is_null()) {
    std::string instructions;
    if (auto e = ReadString(root, "instructions", instructions)) return e;
    r.instructions = std::move(instructions);
  }
  if (auto e = ReadTools(root, r.tools, r.tools_json)) return e;
  if (auto e = ReadToolChoice(root, r.tools, r.tool_choice_json)) return e;
  if (auto e = ReadBool(root, "parallel_tool_calls", r.tools.parallel)) return e;
  if (auto e = ReadText(root, r.response_format, r.text_json)) return e;
  int64_t integer = 0;
  if (auto e = ReadInt(root, "max_output_tokens", 1, 1 << 24, integer)) return e;
  r.max_output_tokens = static_cast<int>(integer);
  r.max_tokens = r.max_output_tokens;
  if (auto e = ReadNumber(root, "temperature", 0, 2, r.sampling.temperature)) return e;
  if (auto e = ReadNumber(root, "top_p", 1e-9, 1, r.sampling.top_p)) return e;
  if (auto e = ReadBool(root, "stream", r.stream)) return e;
  if (root["stream_options"].get(value) == simdjson::SUCCESS && !value.is_null()) {
    if (!r.stream) {
      return ParseError{"'stream_options' is only allowed when 'stream' is true", "stream_options"};
    }
    if (auto e = OnlyKeys(value, {"include_obfuscation"}, "stream_options.")) return e;
    bool obfuscation = false;
    if (auto e = ReadBool(value, "include_obfuscation", obfuscation)) return e;
    if (obfuscation) {
      return ParseError{"'stream_options.include_obfuscation' is only served as false",
                        "stream_options"};
    }
  }
  if (auto e = ReadBool(root, "store", r.store)) return e;
  if (auto e = ReadString(root, "previous_response_id", r.previous_response_id)) return e;
  element reasoning;
  if (root["reasoning"].get(reasoning) == simdjson::SUCCESS && !reasoning.is_null()) {
    if (!reasoning.is_object()) return ParseError{"'reasoning' must be an object", "reasoning"};
    if (auto e = OnlyKeys(reasoning, {"effort", "summary", "generate_summary"}, "reasoning.")) {
      return e;
    }
    r.reasoning_json = simdjson::minify(reasoning);
    if (auto e = ReadString(reasoning, "effort", r.reasoning_effort)) return e;
    for (const char* key : {"summary", "generate_summary"}) {
      std::string summary;
      if (auto e = ReadString(reasoning, key, summary)) return e;
      // "auto": a summary where the model gives one; Sluice's give their reasoning whole.
      if (!summary.empty() && summary != "auto") {
        return ParseError{fmt::format("'reasoning.{}' '{}' is not supported: reasoning comes back "
                                      "whole, not summarised",
                                      key, summary),
                          "reasoning"};
      }
    }
  }
  if (root["metadata"].get(value) == simdjson::SUCCESS && !value.is_null()) {
    simdjson::dom::object metadata;
    if (value.get(metadata) != simdjson::SUCCESS || metadata.size() > 16) {
      return ParseError{"'metadata' must be an object of at most 16 strings", "metadata"};
    }
    for (auto field : metadata) {
      if (!field.value.is_string()) {
        return ParseError{fmt::format("'metadata.{}' must be a string", field.key), "metadata"};
      }
    }
    r.metadata_json = simdjson::minify(value);
  }
  for (const char* key : {"user", "safety_identifier", "prompt_cache_key"}) {
    std::string ignored;
    if (auto e = ReadString(root, key, ignored)) return e;
  }
  std::string truncation = "disabled";
  if (auto e = ReadString(root, "truncation", truncation)) return e;
  if (truncation != "disabled") {
    return ParseError{fmt::format("'truncation' '{}' is not supported: a conversation longer "
                                  "than the context is refused, never cut (\"disabled\")",
                                  truncation),
                      "truncation"};
  }
  simdjson::dom::array include;
  if (root["include"].get(value) == simdjson::SUCCESS && !value.is_null() &&
      (value.get(include) != simdjson::SUCCESS || include.size() > 0)) {
    return ParseError{"'include' is not supported: responses carry their whole output", "include"};
  }
  bool background = false;
  if (auto e = ReadBool(root, "background", background)) return e;
  if (background) {
    return ParseError{"'background' responses are not supported; use 'stream'", "background"};
  }
  std::string tier = "auto";
  if (auto e = ReadString(root, "service_tier", tier)) return e;
  if (tier != "auto" && tier != "default") {
    return ParseError{fmt::format("'service_tier' '{}' is not supported", tier), "service_tier"};
  }
  return std::nullopt;
}

}  // namespace sluice::responses
