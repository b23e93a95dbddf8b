#include "http/anthropic_request.h"

#include <fmt/format.h>
#include <simdjson.h>

#include "common/json_writer.h"

namespace sluice::anthropic {
namespace {

using fields::OnlyKeys;
using fields::ParseObject;
using fields::ReadBool;
using fields::ReadInt;
using fields::ReadNumber;
using fields::ReadString;
using fields::ValidName;
using simdjson::dom::element;

// Text blocks' texts joined by newlines (Claude Code sends a turn as several).
constexpr std::string_view kJoin = "\n";

// `cache_control` ({"type": "ephemeral", "ttl"}) marks a prefix for Anthropic's prompt cache;
// Sluice's prefix cache keeps prefixes without being asked (while its blocks are not needed for
// others), so the mark is served as it is meant.
std::optional<ParseError> ReadCacheControl(const element& value, const std::string& where) {
  std::string_view type;
  if (!value.is_object() || value["type"].get(type) != simdjson::SUCCESS || type != "ephemeral") {
    return ParseError{fmt::format("'{}' must be {{\"type\": \"ephemeral\"}}", where),
                      std::string(where.substr(0, where.find_first_of(".[")))};
  }
  return OnlyKeys(value, {"type", "ttl"}, where + ".");
}

// A block's keys, and its cache_control where it has one.
std::optional<ParseError> BlockKeys(const element& block,
                                    std::initializer_list<std::string_view> keys,
                                    const std::string& where) {
  if (auto e = OnlyKeys(block, keys, where + ".")) return e;
  element cache;
  if (block["cache_control"].get(cache) == simdjson::SUCCESS && !cache.is_null()) {
    return ReadCacheControl(cache, where + ".cache_control");
  }
  return std::nullopt;
}

// A string, or an array of text blocks, as text; `where` names it in errors.
std::optional<ParseError> ReadText(const element& value, const std::string& where,
                                   std::string_view param, std::string& out) {
  std::string_view text;
  if (value.get(text) == simdjson::SUCCESS) {
    out = std::string(text);
    return std::nullopt;
  }
  simdjson::dom::array blocks;
  if (value.get(blocks) != simdjson::SUCCESS) {
    return ParseError{fmt::format("'{}' must be a string or an array of text blocks", where),
                      std::string(param)};
  }
  size_t index = 0;
  for (element block : blocks) {
    const std::string at = fmt::format("{}[{}]", where, index++);
    std::string_view type;
    if (!block.is_object() || block["type"].get(type) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'{}' must be a block with a string 'type'", at),
                        std::string(param)};
    }
    if (type != "text") {
      return ParseError{
          fmt::format("'{}' is a '{}' block; only text blocks are served here", at, type),
          std::string(param)};
    }
    if (auto e = BlockKeys(block, {"type", "text", "cache_control", "citations"}, at)) return e;
    if (block["text"].get(text) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'{}.text' must be a string", at), std::string(param)};
    }
    if (!out.empty()) out += kJoin;
    out += text;
  }
  return std::nullopt;
}

// One message's content blocks into `out` (and, for a user turn's tool_result blocks, tool
// messages before it).
std::optional<ParseError> ReadBlocks(const element& content, size_t index, bool assistant,
                                     std::vector<llm::ChatMessage>& out) {
  llm::ChatMessage message;
  message.role = assistant ? "assistant" : "user";
  simdjson::dom::array blocks;
  std::string_view text;
  if (content.get(text) == simdjson::SUCCESS) {
    message.content = std::string(text);
    out.push_back(std::move(message));
    return std::nullopt;
  }
  if (content.get(blocks) != simdjson::SUCCESS) {
    return ParseError{
        fmt::format("'messages[{}].content' must be a string or an array of blocks", index),
        "messages"};
  }
  bool has_text = false;
  size_t k = 0;
  for (element block : blocks) {
    const std::string at = fmt::format("messages[{}].content[{}]", index, k++);
    std::string_view type;
    if (!block.is_object() || block["type"].get(type) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'{}' must be a block with a string 'type'", at), "messages"};
    }
    if (type == "text") {
      if (auto e = BlockKeys(block, {"type", "text", "cache_control", "citations"}, at)) return e;
      if (block["text"].get(text) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}.text' must be a string", at), "messages"};
      }
      if (has_text) message.content += kJoin;
      message.content += text;
      has_text = true;
    } else if (type == "tool_use" && assistant) {
      if (auto e = BlockKeys(block, {"type", "id", "name", "input", "cache_control"}, at)) {
        return e;
      }
      std::string_view id, name;
      element input;
      if (block["id"].get(id) != simdjson::SUCCESS || id.empty() ||
          block["name"].get(name) != simdjson::SUCCESS ||
          block["input"].get(input) != simdjson::SUCCESS || !input.is_object()) {
        return ParseError{
            fmt::format("'{}' must hold a string 'id', a string 'name' and an object 'input'", at),
            "messages"};
      }
      message.tool_calls.push_back(
          llm::ToolCallRecord{std::string(id), std::string(name), simdjson::minify(input)});
    } else if (type == "thinking" && assistant) {
      if (auto e = BlockKeys(block, {"type", "thinking", "signature", "cache_control"}, at)) {
        return e;
      }
      if (block["thinking"].get(text) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}.thinking' must be a string", at), "messages"};
      }
      message.reasoning_content += text;
    } else if (type == "tool_result" && !assistant) {
      if (auto e = BlockKeys(block, {"type", "tool_use_id", "content", "is_error", "cache_control"},
                             at)) {
        return e;
      }
      llm::ChatMessage result;
      result.role = "tool";
      std::string_view id;
      if (block["tool_use_id"].get(id) != simdjson::SUCCESS || id.empty()) {
        return ParseError{fmt::format("'{}.tool_use_id' (a string) is required", at), "messages"};
      }
      result.tool_call_id = std::string(id);
      element value;
      if (block["content"].get(value) == simdjson::SUCCESS && !value.is_null()) {
        if (auto e = ReadText(value, at + ".content", "messages", result.content)) return e;
      }
      bool is_error = false;
      if (auto e = ReadBool(block, "is_error", is_error)) {
        return ParseError{fmt::format("'{}.is_error' must be true or false", at), "messages"};
      }
      // The template renders a tool message's content only: a failure says so in it.
      if (is_error) result.content = "Error: " + result.content;
      out.push_back(std::move(result));
    } else if (type == "image" || type == "document") {
      return ParseError{
          fmt::format("'{}' is a block of type '{}': Sluice's language models read text "
                      "only",
                      at, type),
          "messages"};
    } else {
      return ParseError{
          fmt::format("'{}': a '{}' block is not supported in {} messages", at, type, message.role),
          "messages"};
    }
  }
  if (has_text || assistant) out.push_back(std::move(message));
  return std::nullopt;
}

std::optional<ParseError> ReadMessages(const element& root, std::vector<llm::ChatMessage>& out) {
  simdjson::dom::array messages;
  if (root["messages"].get(messages) != simdjson::SUCCESS || messages.size() == 0) {
    return ParseError{"'messages' must be a non-empty array", "messages"};
  }
  size_t index = 0;
  for (element m : messages) {
    std::string_view role;
    if (!m.is_object() || m["role"].get(role) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'messages[{}]' must be an object with a string 'role'", index),
                        "messages"};
    }
    if (role != "user" && role != "assistant") {
      return ParseError{fmt::format("'messages[{}].role' '{}' is not one of \"user\" and "
                                    "\"assistant\" (a system prompt goes in 'system')",
                                    index, role),
                        "messages"};
    }
    if (auto e = OnlyKeys(m, {"role", "content"}, fmt::format("messages[{}].", index))) return e;
    element content;
    if (m["content"].get(content) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'messages[{}].content' is required", index), "messages"};
    }
    if (auto e = ReadBlocks(content, index, role == "assistant", out)) return e;
    ++index;
  }
  return std::nullopt;
}

// `tools`: [{"name", "description", "input_schema", "strict"}]; the template sees them in
// OpenAI's function shape, as every chat template is written for.
std::optional<ParseError> ReadTools(const element& root, llm::ToolOptions& out) {
  element tools;
  if (root["tools"].get(tools) != simdjson::SUCCESS || tools.is_null()) return std::nullopt;
  simdjson::dom::array list;
  if (tools.get(list) != simdjson::SUCCESS) return ParseError{"'tools' must be an array", "tools"};
  if (list.size() == 0) return std::nullopt;  // No tools: what Anthropic does with [].
  JsonWriter definitions;
  definitions.BeginArray();
  size_t index = 0;
  for (element tool : list) {
    const std::string where = fmt::format("tools[{}]", index++);
    std::string_view type = "custom";
    if (!tool.is_object()) return ParseError{fmt::format("'{}' must be an object", where), "tools"};
    element value;
    if (tool["type"].get(value) == simdjson::SUCCESS && !value.is_null() &&
        (value.get(type) != simdjson::SUCCESS || type != "custom")) {
      return ParseError{fmt::format("'{}' is Anthropic's built-in tool '{}', which Sluice does not "
                                    "run; declare a custom tool with an input_schema",
                                    where, type),
                        "tools"};
    }
    // eager_input_streaming asks for a call's input in finer deltas; each call is streamed
    // whole, once complete, either way.
    if (auto e = BlockKeys(tool,
                           {"type", "name", "description", "input_schema", "cache_control",
                            "strict", "eager_input_streaming"},
                           where)) {
      return e;
    }
    if (auto e = fields::ReadFunction(tool, "input_schema", /*schema_required=*/true,
                                      /*strict=*/false, where, out, &definitions)) {
      return e;
    }
  }
  definitions.EndArray();
  out.definitions = definitions.str();
  return std::nullopt;
}

// tool_choice: {"type": "auto" | "any" | "tool" (with "name") | "none",
// "disable_parallel_tool_use"}.
std::optional<ParseError> ReadToolChoice(const element& root, llm::ToolOptions& out) {
  constexpr const char* kParam = "tool_choice";
  element choice;
  if (root[kParam].get(choice) != simdjson::SUCCESS || choice.is_null()) return std::nullopt;
  std::string_view type;
  if (!choice.is_object() || choice["type"].get(type) != simdjson::SUCCESS) {
    return ParseError{"'tool_choice' must be an object with a string 'type'", kParam};
  }
  if (auto e = OnlyKeys(choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice.")) {
    return e;
  }
  bool serial = false;
  if (auto e = ReadBool(choice, "disable_parallel_tool_use", serial)) {
    return ParseError{"'tool_choice.disable_parallel_tool_use' must be true or false", kParam};
  }
  out.parallel = !serial;
  if (type == "auto") {
    out.choice = llm::ToolOptions::Choice::kAuto;
  } else if (type == "none") {
    out.choice = llm::ToolOptions::Choice::kNone;
  } else if (type == "any") {
    out.choice = llm::ToolOptions::Choice::kRequired;
  } else if (type == "tool") {
    std::string_view name;
    if (choice["name"].get(name) != simdjson::SUCCESS) {
      return ParseError{"'tool_choice' of type \"tool\" needs the tool's 'name'", kParam};
    }
    if (auto e = fields::ChooseFunction(name, out)) return e;
  } else {
    return ParseError{fmt::format("'tool_choice.type' '{}' is not one of \"auto\", \"any\", "
                                  "\"tool\" and \"none\"",
                                  type),
                      kParam};
  }
  if (auto e = fields::ChoiceNeedsTools(out)) return e;
  return std::nullopt;
}

}  // namespace

std::optional<ParseError> ParseMessages(std::string_view body, bool count_tokens,
                                        MessagesRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  r.chat = true;
  // temperature, top_p and top_k: older SDKs' and other clients' (the newest SDK sends none).
  if (auto e = count_tokens ? OnlyKeys(root, {"model", "messages", "system", "tools", "tool_choice",
                                              "thinking", "cache_control", "output_config"})
                            : OnlyKeys(root, {"model", "messages", "system", "max_tokens",
                                              "stop_sequences", "stream", "temperature", "top_p",
                                              "top_k", "tools", "tool_choice", "thinking",
                                              "metadata", "cache_control", "output_config"})) {
    return e;
  }
  element cache;
  if (root["cache_control"].get(cache) == simdjson::SUCCESS && !cache.is_null()) {
    if (auto e = ReadCacheControl(cache, "cache_control")) return e;
  }
  if (auto e = ReadString(root, "model", r.model)) return e;
  element system;
  if (root["system"].get(system) == simdjson::SUCCESS && !system.is_null()) {
    llm::ChatMessage message;
    message.role = "system";
    if (auto e = ReadText(system, "system", "system", message.content)) return e;
    r.messages.push_back(std::move(message));
  }
  if (auto e = ReadMessages(root, r.messages)) return e;
  if (auto e = ReadTools(root, r.tools)) return e;
  if (auto e = ReadToolChoice(root, r.tools)) return e;
  element thinking;
  int64_t budget = 0;
  if (root["thinking"].get(thinking) == simdjson::SUCCESS && !thinking.is_null()) {
    std::string_view type;
    if (!thinking.is_object() || thinking["type"].get(type) != simdjson::SUCCESS ||
        (type != "enabled" && type != "disabled" && type != "adaptive")) {
      return ParseError{
          "'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": ...}, "
          "{\"type\": \"adaptive\"} or {\"type\": \"disabled\"}",
          "thinking"};
    }
    if (auto e = OnlyKeys(thinking, {"type", "budget_tokens", "display"}, "thinking.")) return e;
    // budget_tokens must lie below max_tokens (as Anthropic requires), which bounds the whole
    // reply, reasoning included; the reasoning is not cut at the budget itself.
    if (auto e = ReadInt(thinking, "budget_tokens", 1, 1 << 24, budget)) return e;
    if (type != "adaptive") r.thinking = type == "enabled";
    std::string display = "summarized";
    if (auto e = ReadString(thinking, "display", display)) return e;
    if (display != "summarized" && display != "omitted") {
      return ParseError{fmt::format("'thinking.display' '{}' is not one of \"summarized\" and "
                                    "\"omitted\"",
                                    display),
                        "thinking"};
    }
    r.omit_thinking = display == "omitted";
  }
  element output;
  if (root["output_config"].get(output) == simdjson::SUCCESS && !output.is_null()) {
    if (!output.is_object())
      return ParseError{"'output_config' must be an object", "output_config"};
    if (auto e = OnlyKeys(output, {"format"}, "output_config.")) return e;
    element format;
    if (output["format"].get(format) == simdjson::SUCCESS && !format.is_null()) {
      std::string_view type;
      element schema;
      if (!format.is_object() || format["type"].get(type) != simdjson::SUCCESS ||
          type != "json_schema" || format["schema"].get(schema) != simdjson::SUCCESS ||
          !schema.is_object()) {
        return ParseError{
            "'output_config.format' must be {\"type\": \"json_schema\", \"schema\": "
            "a JSON Schema object}",
            "output_config"};
      }
      if (auto e = OnlyKeys(format, {"type", "schema"}, "output_config.format.")) return e;
      r.response_format.type = llm::ResponseFormat::Type::kJsonSchema;
      r.response_format.schema = simdjson::minify(schema);
    }
  }
  if (count_tokens) return std::nullopt;

  element value;
  if (root["max_tokens"].get(value) != simdjson::SUCCESS || value.is_null()) {
    return ParseError{"'max_tokens' is required", "max_tokens"};
  }
  int64_t max_tokens = 0;
  if (auto e = ReadInt(root, "max_tokens", 1, 1 << 24, max_tokens)) return e;
  r.max_tokens = static_cast<int>(max_tokens);
  if (budget >= max_tokens) {
    return ParseError{
        fmt::format("'thinking.budget_tokens' ({}) must be less than 'max_tokens' ({})", budget,
                    max_tokens),
        "thinking"};
  }
  if (auto e = ReadBool(root, "stream", r.stream)) return e;
  // Anthropic's temperature lies in [0, 1].
  if (auto e = ReadNumber(root, "temperature", 0, 1, r.sampling.temperature)) return e;
  if (auto e = ReadNumber(root, "top_p", 1e-9, 1, r.sampling.top_p)) return e;
  int64_t top_k = 0;
  if (auto e = ReadInt(root, "top_k", 0, 1 << 24, top_k)) return e;
  r.sampling.top_k = static_cast<int>(top_k);
  element stops;
  if (root["stop_sequences"].get(stops) == simdjson::SUCCESS && !stops.is_null()) {
    simdjson::dom::array list;
    if (stops.get(list) != simdjson::SUCCESS) {
      return ParseError{"'stop_sequences' must be an array of strings", "stop_sequences"};
    }
    for (element stop : list) {
      std::string_view text;
      if (stop.get(text) != simdjson::SUCCESS || text.empty()) {
        return ParseError{"'stop_sequences' must hold non-empty strings", "stop_sequences"};
      }
      r.stop.emplace_back(text);
    }
  }
  element metadata;
  if (root["metadata"].get(metadata) == simdjson::SUCCESS && !metadata.is_null()) {
    // user_id identifies the caller to Anthropic's abuse checks; nothing here depends on it.
    if (!metadata.is_object()) return ParseError{"'metadata' must be an object", "metadata"};
    if (auto e = OnlyKeys(metadata, {"user_id"}, "metadata.")) return e;
  }
  return std::nullopt;
}

}  // namespace sluice::anthropic
