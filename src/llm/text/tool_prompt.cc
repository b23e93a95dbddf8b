#include "llm/text/tool_prompt.h"

#include <fmt/format.h>

#include <map>
#include <utility>

#include "common/json_writer.h"

namespace sluice::llm {
namespace {

std::string Preamble(const std::string& definitions, bool parallel) {
  return fmt::format(
      "You can call these functions (each with the JSON Schema of its arguments):\n{}\n\n"
      "To call {}, reply with only a JSON array of calls: "
      "[{{\"name\": \"<function>\", \"arguments\": {{<arguments>}}}}]. Each result comes "
      "back in a message beginning \"Result of\". Otherwise reply in plain text.",
      definitions, parallel ? "one or more" : "one of them");
}

// An assistant turn's calls as the preamble asks for them.
std::string CallsText(const std::vector<ToolCallRecord>& calls) {
  JsonWriter json;
  json.BeginArray();
  for (const ToolCallRecord& call : calls) {
    json.BeginObject().Field("name", call.name).Key("arguments");
    json.Raw(call.arguments.empty() ? std::string("{}") : call.arguments);
    json.EndObject();
  }
  json.EndArray();
  return json.str();
}

void Append(std::string& text, const std::string& more) {
  if (!text.empty() && !more.empty()) text += "\n\n";
  text += more;
}

}  // namespace

std::vector<ChatMessage> ToolsInConversation(const std::vector<ChatMessage>& messages,
                                             const std::string& definitions, bool parallel,
                                             ToolPreamblePlace place) {
  std::map<std::string, std::string> names;  // A call's id: its function's name.
  std::vector<ChatMessage> out;
  bool merge_user = false;  // The last user turn holds tool results: what follows joins it.
  for (const ChatMessage& message : messages) {
    if (message.role == "assistant" && !message.tool_calls.empty()) {
      for (const ToolCallRecord& call : message.tool_calls) names[call.id] = call.name;
      ChatMessage turn = message;
      turn.tool_calls.clear();
      Append(turn.content, CallsText(message.tool_calls));
      out.push_back(std::move(turn));
      merge_user = false;
      continue;
    }
    if (message.role == "tool" || (message.role == "user" && merge_user)) {
      std::string text = message.content;
      if (message.role == "tool") {
        std::string name = message.name;
        if (name.empty()) {
          auto it = names.find(message.tool_call_id);
          if (it != names.end()) name = it->second;
        }
        text = fmt::format("Result of {}:\n{}", name.empty() ? std::string("the call") : name,
                           message.content);
      }
      if (merge_user) {
        Append(out.back().content, text);
      } else {
        ChatMessage turn;
        turn.role = "user";
        turn.content = std::move(text);
        out.push_back(std::move(turn));
      }
      merge_user = true;
      continue;
    }
    out.push_back(message);
    merge_user = false;
  }
  if (definitions.empty()) return out;
  const std::string preamble = Preamble(definitions, parallel);
  if (place == ToolPreamblePlace::kSystem) {
    if (!out.empty() && out.front().role == "system") {
      out.front().content = preamble + "\n\n" + out.front().content;
    } else {
      ChatMessage system;
      system.role = "system";
      system.content = preamble;
      out.insert(out.begin(), std::move(system));
    }
    return out;
  }
  for (ChatMessage& message : out) {
    if (message.role == "user") {
      message.content = preamble + "\n\n" + message.content;
      return out;
    }
  }
  ChatMessage user;
  user.role = "user";
  user.content = preamble;
  out.insert(out.begin(), std::move(user));
  return out;
}

}  // namespace sluice::llm
