#include "http/openai_request.h"

#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <cctype>

namespace sluice::openai {
namespace {

using fields::OnlyKeys;
using fields::ParseObject;
using fields::ReadBool;
using fields::ReadKeepAlive;
using fields::ReadInt;
using fields::ReadNumber;
using fields::ReadString;
using fields::ValidName;
using simdjson::dom::element;

// Content as a string, or OpenAI's array of parts of which the text ones are joined.
std::optional<ParseError> ReadContent(const element& message, std::string& out) {
  element content;
  if (message["content"].get(content) != simdjson::SUCCESS || content.is_null()) {
    out.clear();
    return std::nullopt;
  }
  std::string_view text;
  if (content.get(text) == simdjson::SUCCESS) {
    out = std::string(text);
    return std::nullopt;
  }
  simdjson::dom::array parts;
  if (content.get(parts) != simdjson::SUCCESS) {
    return ParseError{"message content must be a string or an array of text parts", "messages"};
  }
  for (element part : parts) {
    std::string_view type;
    if (part["type"].get(type) != simdjson::SUCCESS || type != "text" ||
        part["text"].get(text) != simdjson::SUCCESS) {
      return ParseError{"only text content parts are supported", "messages"};
    }
    out += text;
  }
  return std::nullopt;
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": JSON text}}].
std::optional<ParseError> ReadToolCalls(const element& calls, size_t index,
                                        std::vector<llm::ToolCallRecord>& out) {
  const std::string where = fmt::format("'messages[{}].tool_calls'", index);
  simdjson::dom::array list;
  if (calls.get(list) != simdjson::SUCCESS) {
    return ParseError{where + " must be an array", "messages"};
  }
  for (element call : list) {
    std::string_view id, type, name, arguments;
    element function;
    if (!call.is_object() || call["id"].get(id) != simdjson::SUCCESS ||
        call["type"].get(type) != simdjson::SUCCESS || type != "function" ||
        call["function"].get(function) != simdjson::SUCCESS ||
        function["name"].get(name) != simdjson::SUCCESS ||
        function["arguments"].get(arguments) != simdjson::SUCCESS) {
      return ParseError{where +
                            " must hold {\"id\", \"type\": \"function\", \"function\": "
                            "{\"name\", \"arguments\": a string}}",
                        "messages"};
    }
    out.push_back(llm::ToolCallRecord{std::string(id), std::string(name), std::string(arguments)});
  }
  return std::nullopt;
}

// root["messages"]: a non-empty array of {role, content, name}, assistant messages' tool_calls
// and tool messages' tool_call_id. Any other field (the deprecated function_call) is refused by
// name, not dropped: a conversation whose links were lost would be answered as another one.
std::optional<ParseError> ReadMessages(const element& root, std::vector<llm::ChatMessage>& out) {
  simdjson::dom::array messages;
  if (root["messages"].get(messages) != simdjson::SUCCESS || messages.size() == 0) {
    return ParseError{"'messages' must be a non-empty array", "messages"};
  }
  std::string_view text;
  size_t index = 0;
  for (element m : messages) {
    llm::ChatMessage message;
    simdjson::dom::object fields;
    if (m.get(fields) != simdjson::SUCCESS) {
      return ParseError{fmt::format("'messages[{}]' must be an object", index), "messages"};
    }
    if (m["role"].get(text) != simdjson::SUCCESS) {
      return ParseError{"each message needs a string 'role'", "messages"};
    }
    message.role = std::string(text);
    if (message.role == "function") {
      return ParseError{fmt::format("'messages[{}]': role 'function' (deprecated) is not "
                                    "supported; use 'tool'",
                                    index),
                        "messages"};
    }
    if (message.role != "system" && message.role != "user" && message.role != "assistant" &&
        message.role != "developer" && message.role != "tool") {
      return ParseError{fmt::format("unknown message role '{}'", message.role), "messages"};
    }
    for (auto field : fields) {
      if (field.key == "role" || field.key == "content" || field.key == "name") continue;
      if (field.key == "tool_calls" && message.role == "assistant") continue;
      // A reply's reasoning sent back with it (an agent loop appends the reply as it came).
      if ((field.key == "reasoning_content" || field.key == "reasoning") &&
          message.role == "assistant") {
        continue;
      }
      if (field.key == "tool_call_id" && message.role == "tool") continue;
      return ParseError{fmt::format("'messages[{}].{}' is not supported{}", index, field.key,
                                    field.key == "tool_calls"     ? " outside assistant messages"
                                    : field.key == "tool_call_id" ? " outside tool messages"
                                                                  : ""),
                        "messages"};
    }
    if (auto error = ReadContent(m, message.content)) return error;
    element value;
    if (m["name"].get(value) == simdjson::SUCCESS && !value.is_null()) {
      if (value.get(text) != simdjson::SUCCESS || text.empty()) {
        return ParseError{fmt::format("'messages[{}].name' must be a non-empty string", index),
                          "messages"};
      }
      message.name = std::string(text);
    }
    if (m["tool_calls"].get(value) == simdjson::SUCCESS && !value.is_null()) {
      if (auto error = ReadToolCalls(value, index, message.tool_calls)) return error;
    }
    for (const char* key : {"reasoning_content", "reasoning"}) {
      if (m[key].get(value) != simdjson::SUCCESS || value.is_null()) continue;
      if (value.get(text) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'messages[{}].{}' must be a string", index, key),
                          "messages"};
      }
      message.reasoning_content = std::string(text);
    }
    if (message.role == "tool") {
      if (m["tool_call_id"].get(text) != simdjson::SUCCESS || text.empty()) {
        return ParseError{
            fmt::format("'messages[{}].tool_call_id' (a string) is required in tool messages",
                        index),
            "messages"};
      }
      message.tool_call_id = std::string(text);
    }
    out.push_back(std::move(message));
    ++index;
  }
  return std::nullopt;
}

// root["response_format"]: {"type": "text"}, {"type": "json_object"}, or {"type": "json_schema",
// "json_schema": {"name", "description", "schema", "strict"}} (OpenAI's shape).
std::optional<ParseError> ReadResponseFormat(const element& root, ResponseFormat& out) {
  constexpr const char* kParam = "response_format";
  element format;
  if (root[kParam].get(format) != simdjson::SUCCESS || format.is_null()) return std::nullopt;
  std::string_view type;
  if (!format.is_object() || format["type"].get(type) != simdjson::SUCCESS) {
    return ParseError{"'response_format' must be an object with a string 'type'", kParam};
  }
  if (type == "text") {
    if (auto e = OnlyKeys(format, {"type"}, "response_format.")) return e;
    out.type = ResponseFormat::Type::kText;
    return std::nullopt;
  }
  if (type == "json_object") {
    if (auto e = OnlyKeys(format, {"type"}, "response_format.")) return e;
    out.type = ResponseFormat::Type::kJsonObject;
    return std::nullopt;
  }
  if (type != "json_schema") {
    return ParseError{fmt::format("response_format type '{}' is not supported; use 'text', "
                                  "'json_object' or 'json_schema'",
                                  type),
                      kParam};
  }
  if (auto e = OnlyKeys(format, {"type", "json_schema"}, "response_format.")) return e;
  element spec;
  if (format["json_schema"].get(spec) != simdjson::SUCCESS || !spec.is_object()) {
    return ParseError{"'response_format.json_schema' (an object) is required", kParam};
  }
  if (auto e = OnlyKeys(spec, {"name", "description", "schema", "strict"},
                        "response_format.json_schema.")) {
    return e;
  }
  std::string_view name;
  element value;
  if (spec["name"].get(value) == simdjson::SUCCESS &&
      (value.get(name) != simdjson::SUCCESS || !ValidName(name))) {
    return ParseError{"'response_format.json_schema.name' must be 1-64 letters, digits, '_' or '-'",
                      kParam};
  }
  // strict: false is served as true: OpenAI promises adherence only with true, and a reply that
  // always follows the schema is within what false allows.
  bool strict = true;
  if (spec["strict"].get(value) == simdjson::SUCCESS && !value.is_null() &&
      value.get(strict) != simdjson::SUCCESS) {
    return ParseError{"'response_format.json_schema.strict' must be true or false", kParam};
  }
  element schema;
  if (spec["schema"].get(schema) != simdjson::SUCCESS || !schema.is_object()) {
    return ParseError{"'response_format.json_schema.schema' (a JSON Schema object) is required",
                      kParam};
  }
  out.type = ResponseFormat::Type::kJsonSchema;
  out.schema = simdjson::minify(schema);
  return std::nullopt;
}

// root["tools"], ["tool_choice"] and ["parallel_tool_calls"] (OpenAI's shapes).
std::optional<ParseError> ReadTools(const element& root, llm::ToolOptions& out) {
  element tools;
  const bool given = root["tools"].get(tools) == simdjson::SUCCESS && !tools.is_null();
  if (given) {
    simdjson::dom::array list;
    if (tools.get(list) != simdjson::SUCCESS || list.size() == 0) {
      return ParseError{"'tools' must be a non-empty array", "tools"};
    }
    size_t index = 0;
    for (element tool : list) {
      const std::string where = fmt::format("tools[{}]", index++);
      std::string_view type;
      if (!tool.is_object() || tool["type"].get(type) != simdjson::SUCCESS) {
        return ParseError{fmt::format("'{}' must be an object with a string 'type'", where),
                          "tools"};
      }
      if (type != "function") {
        return ParseError{
            fmt::format("'{}.type' '{}' is not supported; only 'function' tools are", where, type),
            "tools"};
      }
      if (auto e = OnlyKeys(tool, {"type", "function"}, where + ".")) return e;
      element function;
      if (tool["function"].get(function) != simdjson::SUCCESS || !function.is_object()) {
        return ParseError{fmt::format("'{}.function' (an object) is required", where), "tools"};
      }
      if (auto e = OnlyKeys(function, {"name", "description", "parameters", "strict"},
                            where + ".function.")) {
        return e;
      }
      // The request's tools are the template's as they are (already the chat shape).
      if (auto e = fields::ReadFunction(function, "parameters", /*schema_required=*/false,
                                        /*strict=*/false, where + ".function", out, nullptr)) {
        return e;
      }
    }
    out.definitions = simdjson::minify(tools);
  }
  element choice;
  if (root["tool_choice"].get(choice) == simdjson::SUCCESS && !choice.is_null()) {
    constexpr const char* kParam = "tool_choice";
    std::string_view text;
    if (choice.get(text) == simdjson::SUCCESS) {
      if (!fields::ChoiceWord(text, out.choice)) {
        return ParseError{fmt::format("'tool_choice' '{}' is not one of \"auto\", \"none\", "
                                      "\"required\" or a named function",
                                      text),
                          kParam};
      }
    } else {
      std::string_view type, name;
      element function;
      if (!choice.is_object() || choice["type"].get(type) != simdjson::SUCCESS ||
          type != "function" || choice["function"].get(function) != simdjson::SUCCESS ||
          function["name"].get(name) != simdjson::SUCCESS) {
        return ParseError{
            "'tool_choice' must be \"auto\", \"none\", \"required\" or "
            "{\"type\": \"function\", \"function\": {\"name\": ...}}",
            kParam};
      }
      if (auto e = OnlyKeys(choice, {"type", "function"}, "tool_choice.")) return e;
      if (auto e = OnlyKeys(function, {"name"}, "tool_choice.function.")) return e;
      if (auto e = fields::ChooseFunction(name, out)) return e;
    }
    if (auto e = fields::ChoiceNeedsTools(out)) return e;
  }
  element parallel;
  if (root["parallel_tool_calls"].get(parallel) == simdjson::SUCCESS && !parallel.is_null() &&
      parallel.get(out.parallel) != simdjson::SUCCESS) {
    return ParseError{"'parallel_tool_calls' must be true or false", "parallel_tool_calls"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<ParseError> ParseCompletion(std::string_view body, bool chat, CompletionRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  r.chat = chat;
  std::string_view text;
  // Absent: the one model served, if there is only one (as vLLM does); a server of several
  // answers 400 naming 'model'.
  if (auto e = ReadString(root, "model", r.model)) return e;
  if (chat) {
    if (auto error = ReadMessages(root, r.messages)) return error;
  } else {
    element prompt;
    if (root["prompt"].get(prompt) != simdjson::SUCCESS) {
      return ParseError{"'prompt' is required", "prompt"};
    }
    // A string or token ids, each alone or as an array of one (OpenAI's batch of prompts).
    simdjson::dom::array list, ids;
    if (prompt.get(list) == simdjson::SUCCESS && list.size() == 1 &&
        (list.at(0).is_string() || list.at(0).is_array())) {
      prompt = list.at(0).value();
    }
    if (prompt.get(text) == simdjson::SUCCESS) {
      r.prompt = std::string(text);
    } else if (prompt.get(ids) == simdjson::SUCCESS && ids.size() > 0) {
      for (element id : ids) {
        int64_t token = 0;
        if (id.get(token) != simdjson::SUCCESS) {
          return ParseError{"'prompt' as token ids must hold integers only", "prompt"};
        }
        r.prompt_tokens.push_back(token);
      }
    } else {
      return ParseError{
          "'prompt' must be a string or an array of token ids (or an array of one of them)",
          "prompt"};
    }
  }
  // Parameters Sluice does not serve (tools, logit_bias, echo, best_of, ...) are refused by
  // name, never ignored.
  if (auto error =
          chat ? OnlyKeys(root, {"model",
                                 "messages",
                                 "stream",
                                 "stream_options",
                                 "max_tokens",
                                 "max_completion_tokens",
                                 "temperature",
                                 "top_p",
                                 "top_k",
                                 "seed",
                                 "stop",
                                 "frequency_penalty",
                                 "presence_penalty",
                                 "repetition_penalty",
                                 "ignore_eos",
                                 "n",
                                 "logprobs",
                                 "top_logprobs",
                                 "response_format",
                                 "user",
                                 "chat_template_kwargs",
                                 "tools",
                                 "tool_choice",
                                 "parallel_tool_calls",
                                 "keep_alive"})
               : OnlyKeys(root, {"model", "prompt", "stream", "stream_options", "max_tokens",
                                 "temperature", "top_p", "top_k", "seed", "stop",
                                 "frequency_penalty", "presence_penalty", "repetition_penalty",
                                 "ignore_eos", "n", "logprobs", "response_format", "user",
                                 "keep_alive"})) {
    return error;
  }
  if (auto e = ReadKeepAlive(root, "keep_alive", r.keep_alive)) return e;
  if (auto e = ReadBool(root, "stream", r.stream)) return e;
  element options;
  if (root["stream_options"].get(options) == simdjson::SUCCESS && !options.is_null()) {
    if (!r.stream) {
      return ParseError{"'stream_options' is only allowed when 'stream' is true", "stream_options"};
    }
    if (!options.is_object()) {
      return ParseError{"'stream_options' must be an object", "stream_options"};
    }
    if (auto e = OnlyKeys(options, {"include_usage", "include_obfuscation"}, "stream_options.")) {
      return e;
    }
    element usage;
    if (options["include_usage"].get(usage) == simdjson::SUCCESS && !usage.is_null() &&
        usage.get(r.include_usage) != simdjson::SUCCESS) {
      return ParseError{"'stream_options.include_usage' must be true or false", "stream_options"};
    }
    // Sluice's deltas carry no obfuscation padding: false is what it does, true is refused.
    bool obfuscation = false;
    element padding;
    if (options["include_obfuscation"].get(padding) == simdjson::SUCCESS && !padding.is_null() &&
        (padding.get(obfuscation) != simdjson::SUCCESS || obfuscation)) {
      return ParseError{"'stream_options.include_obfuscation' is only served as false",
                        "stream_options"};
    }
  }
  if (auto e = ReadBool(root, "ignore_eos", r.ignore_eos)) return e;
  element kwargs;
  if (chat && root["chat_template_kwargs"].get(kwargs) == simdjson::SUCCESS && !kwargs.is_null()) {
    constexpr const char* kParam = "chat_template_kwargs";
    simdjson::dom::object fields;
    if (kwargs.get(fields) != simdjson::SUCCESS) {
      return ParseError{"'chat_template_kwargs' must be an object", kParam};
    }
    for (auto field : fields) {
      const std::string key(field.key);
      if (key == "messages" || key == "add_generation_prompt" || key == "tools") {
        return ParseError{
            fmt::format("'chat_template_kwargs.{}' is set by the request itself", key), kParam};
      }
      bool flag = false;
      int64_t integer = 0;
      if (field.value.get(flag) == simdjson::SUCCESS) {
        r.template_arguments[key] = flag;
      } else if (field.value.get(integer) == simdjson::SUCCESS) {
        r.template_arguments[key] = integer;
      } else if (field.value.get(text) == simdjson::SUCCESS) {
        r.template_arguments[key] = std::string(text);
      } else {
        return ParseError{fmt::format("'chat_template_kwargs.{}' must be a boolean, an integer or "
                                      "a string",
                                      key),
                          kParam};
      }
    }
  }
  if (auto e = ReadResponseFormat(root, r.response_format)) return e;
  if (chat) {
    if (auto e = ReadTools(root, r.tools)) return e;
  }
  if (r.ignore_eos && r.response_format.type != ResponseFormat::Type::kText) {
    return ParseError{"'ignore_eos' cannot be combined with a JSON 'response_format'",
                      "ignore_eos"};
  }
  int64_t integer = 1;
  if (auto e = ReadInt(root, "n", 1, 128, integer)) return e;
  r.n = static_cast<int>(integer);
  if (chat) {
    // logprobs: true for the chosen tokens'; top_logprobs: how many alternatives beside.
    bool logprobs = false;
    if (auto e = ReadBool(root, "logprobs", logprobs)) return e;
    integer = -1;
    if (auto e = ReadInt(root, "top_logprobs", 0, 20, integer)) return e;
    if (integer >= 0 && !logprobs) {
      return ParseError{"'top_logprobs' needs 'logprobs': true", "top_logprobs"};
    }
    if (logprobs) r.top_logprobs = std::max<int>(0, static_cast<int>(integer));
  } else {
    // logprobs: the number of alternatives beside each chosen token.
    integer = -1;
    if (auto e = ReadInt(root, "logprobs", 0, 20, integer)) return e;
    r.top_logprobs = static_cast<int>(integer);
  }
  int64_t given = 0;
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    integer = 0;
    if (auto e = ReadInt(root, key, 1, 1 << 24, integer)) return e;
    if (integer > 0) {
      // Two limits that may disagree: which one is meant is not Sluice's to guess.
      if (given > 0) {
        return ParseError{"give 'max_tokens' or 'max_completion_tokens', not both", key};
      }
      given = integer;
      r.max_tokens = static_cast<int>(integer);
    }
  }
  integer = 0;
  if (auto e = ReadInt(root, "top_k", -1, 1 << 24, integer)) return e;
  r.sampling.top_k = integer < 0 ? 0 : static_cast<int>(integer);
  element seed;
  if (root["seed"].get(seed) == simdjson::SUCCESS && !seed.is_null()) {
    // Any 64-bit integer, signed or not.
    int64_t signed_seed = 0;
    uint64_t unsigned_seed = 0;
    if (seed.get(signed_seed) == simdjson::SUCCESS) {
      r.sampling.seed = static_cast<uint64_t>(signed_seed);
    } else if (seed.get(unsigned_seed) == simdjson::SUCCESS) {
      r.sampling.seed = unsigned_seed;
    } else {
      return ParseError{"'seed' must be an integer", "seed"};
    }
  }
  if (auto e = ReadNumber(root, "temperature", 0, 2, r.sampling.temperature)) return e;
  if (auto e = ReadNumber(root, "top_p", 1e-9, 1, r.sampling.top_p)) return e;
  if (auto e = ReadNumber(root, "frequency_penalty", -2, 2, r.sampling.frequency_penalty)) return e;
  if (auto e = ReadNumber(root, "presence_penalty", -2, 2, r.sampling.presence_penalty)) return e;
  if (auto e = ReadNumber(root, "repetition_penalty", 1e-3, 100, r.sampling.repetition_penalty))
    return e;
  element stop;
  if (root["stop"].get(stop) == simdjson::SUCCESS && !stop.is_null()) {
    simdjson::dom::array list;
    if (stop.get(text) == simdjson::SUCCESS) {
      r.stop.emplace_back(text);
    } else if (stop.get(list) == simdjson::SUCCESS && list.size() <= 4) {
      for (element item : list) {
        if (item.get(text) != simdjson::SUCCESS)
          return ParseError{"'stop' must hold strings", "stop"};
        r.stop.emplace_back(text);
      }
    } else {
      return ParseError{"'stop' must be a string or an array of up to 4 strings", "stop"};
    }
    for (const std::string& s : r.stop) {
      if (s.empty()) return ParseError{"stop strings must not be empty", "stop"};
    }
  }
  return std::nullopt;
}

std::optional<ParseError> ParseRerank(std::string_view body, RerankRequest& r) {
  constexpr size_t kMaxDocuments = 1000;  // Cohere's limit.
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  if (auto e = OnlyKeys(root, {"model", "query", "documents", "top_n", "return_documents"})) {
    return e;
  }
  if (auto e = ReadString(root, "model", r.model)) return e;
  element query;
  if (root["query"].get(query) != simdjson::SUCCESS || query.is_null()) {
    return ParseError{"'query' is required", "query"};
  }
  if (auto e = ReadString(root, "query", r.query)) return e;
  if (auto e = ReadInt(root, "top_n", 1, 1 << 20, r.top_n)) return e;
  if (auto e = ReadBool(root, "return_documents", r.return_documents)) return e;
  simdjson::dom::array documents;
  if (root["documents"].get(documents) != simdjson::SUCCESS) {
    return ParseError{"'documents' is required: a list of strings or of {\"text\": ...}",
                      "documents"};
  }
  if (documents.size() == 0) return ParseError{"'documents' must not be empty", "documents"};
  if (documents.size() > kMaxDocuments) {
    return ParseError{
        fmt::format("'documents' holds {} items; at most {}", documents.size(), kMaxDocuments),
        "documents"};
  }
  for (element document : documents) {
    std::string_view text;
    if (document.get(text) != simdjson::SUCCESS &&
        document["text"].get(text) != simdjson::SUCCESS) {
      return ParseError{
          fmt::format("document {} is neither a string nor {{\"text\": ...}}", r.documents.size()),
          "documents"};
    }
    r.documents.emplace_back(text);
  }
  return std::nullopt;
}

std::optional<ParseError> ParseEmbeddings(std::string_view body, EmbeddingsRequest& r) {
  constexpr size_t kMaxInputs = 2048;  // OpenAI's limit.
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  if (auto e = OnlyKeys(root, {"model", "input", "encoding_format", "dimensions", "user",
                               "keep_alive"})) {
    return e;
  }
  if (auto e = ReadKeepAlive(root, "keep_alive", r.keep_alive)) return e;
  if (auto e = ReadString(root, "model", r.model)) return e;
  std::string format = "float";
  if (auto e = ReadString(root, "encoding_format", format)) return e;
  if (format != "float" && format != "base64") {
    return ParseError{
        fmt::format("'encoding_format' '{}' is not supported; use \"float\" or \"base64\"", format),
        "encoding_format"};
  }
  r.base64 = format == "base64";
  if (auto e = ReadInt(root, "dimensions", 1, 1 << 20, r.dimensions)) return e;
  if (auto e = ReadString(root, "user", format)) return e;
  constexpr const char* kShape =
      "'input' must be a string, an array of strings, an array of token ids or an array of "
      "arrays of token ids";
  element input;
  if (root["input"].get(input) != simdjson::SUCCESS) {
    return ParseError{"'input' is required", "input"};
  }
  // Token ids, or false where `value` is not an array of integers.
  auto read_tokens = [](const element& value, std::vector<int64_t>& out) {
    simdjson::dom::array ids;
    if (value.get(ids) != simdjson::SUCCESS) return false;
    for (element id : ids) {
      int64_t token = 0;
      if (id.get(token) != simdjson::SUCCESS) return false;
      out.push_back(token);
    }
    return true;
  };
  std::string_view text;
  simdjson::dom::array list;
  if (input.get(text) == simdjson::SUCCESS) {
    r.inputs.push_back(llm::EmbeddingInput{std::string(text), {}, false});
  } else if (input.get(list) == simdjson::SUCCESS) {
    if (list.size() == 0) return ParseError{"'input' must not be empty", "input"};
    if (list.size() > kMaxInputs) {
      return ParseError{fmt::format("'input' holds {} items; at most {}", list.size(), kMaxInputs),
                        "input"};
    }
    if (list.at(0).is_int64()) {
      llm::EmbeddingInput tokens{"", {}, true};
      if (!read_tokens(input, tokens.tokens)) return ParseError{kShape, "input"};
      r.inputs.push_back(std::move(tokens));
    } else {
      for (element item : list) {
        llm::EmbeddingInput one;
        if (item.get(text) == simdjson::SUCCESS) {
          one.text = std::string(text);
        } else if (item.is_array() && read_tokens(item, one.tokens)) {
          one.is_tokens = true;
        } else {
          return ParseError{kShape, "input"};
        }
        r.inputs.push_back(std::move(one));
      }
    }
  } else {
    return ParseError{kShape, "input"};
  }
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    if (r.inputs[i].is_tokens ? r.inputs[i].tokens.empty() : r.inputs[i].text.empty()) {
      return ParseError{fmt::format("input {} is empty", i), "input"};
    }
  }
  return std::nullopt;
}

std::optional<ParseError> ParseLoraAdapter(std::string_view body, bool load,
                                           LoraAdapterRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  if (auto e = load ? OnlyKeys(root, {"model", "lora_name", "lora_path"})
                    : OnlyKeys(root, {"model", "lora_name", "lora_int_id"})) {
    return e;
  }
  if (auto e = ReadString(root, "model", r.model)) return e;
  if (auto e = ReadString(root, "lora_name", r.name)) return e;
  if (r.name.empty() || r.name.size() > 128 ||
      !std::all_of(r.name.begin(), r.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' ||
               c == '/' || c == ':';
      })) {
    return ParseError{"'lora_name' must be 1-128 letters, digits, '_', '-', '.', '/' or ':'",
                      "lora_name"};
  }
  if (load) {
    if (auto e = ReadString(root, "lora_path", r.path)) return e;
    if (r.path.empty()) return ParseError{"'lora_path' (a folder) is required", "lora_path"};
  }
  return std::nullopt;
}

std::optional<ParseError> ParseTokenize(std::string_view body, TokenizeRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  r.chat = root["messages"].error() == simdjson::SUCCESS;
  r.add_special_tokens = !r.chat;
  if (auto e = OnlyKeys(
          root, {"model", "prompt", "messages", "add_special_tokens", "add_generation_prompt"})) {
    return e;
  }
  if (auto e = ReadBool(root, "add_special_tokens", r.add_special_tokens)) return e;
  if (auto e = ReadBool(root, "add_generation_prompt", r.add_generation_prompt)) return e;
  if (auto e = ReadString(root, "model", r.model)) return e;
  if (r.chat) {
    if (root["prompt"].error() == simdjson::SUCCESS) {
      return ParseError{"give 'prompt' or 'messages', not both", "prompt"};
    }
    return ReadMessages(root, r.messages);
  }
  std::string_view text;
  if (root["prompt"].get(text) != simdjson::SUCCESS) {
    return ParseError{"'prompt' (a string) or 'messages' is required", "prompt"};
  }
  r.prompt = std::string(text);
  return std::nullopt;
}

std::optional<ParseError> ParseDetokenize(std::string_view body, DetokenizeRequest& r) {
  simdjson::dom::parser parser;
  element root;
  if (auto error = ParseObject(parser, body, root)) return error;
  if (auto e = OnlyKeys(root, {"model", "tokens"})) return e;
  if (auto e = ReadString(root, "model", r.model)) return e;
  simdjson::dom::array tokens;
  if (root["tokens"].get(tokens) != simdjson::SUCCESS) {
    return ParseError{"'tokens' (an array of token ids) is required", "tokens"};
  }
  for (element token : tokens) {
    int64_t id = 0;
    if (token.get(id) != simdjson::SUCCESS) {
      return ParseError{"'tokens' must hold integer token ids", "tokens"};
    }
    r.tokens.push_back(id);
  }
  return std::nullopt;
}

}  // namespace sluice::openai
