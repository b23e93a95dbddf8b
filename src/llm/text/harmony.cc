#include "llm/text/harmony.h"

#include <simdjson.h>

#include <algorithm>
#include <array>

#include "common/json_writer.h"

namespace sluice::llm {
namespace {

constexpr std::string_view kMessage = "<|message|>";
constexpr std::string_view kChannel = "<|channel|>";
constexpr std::array<std::string_view, 3> kEnds = {"<|end|>", "<|return|>", "<|call|>"};
// A header longer than this is no header: text the model wrote outside the format.
constexpr size_t kLongestHeader = 256;

std::string_view Trim(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \n\t\r");
  if (begin == std::string_view::npos) return {};
  return text.substr(begin, text.find_last_not_of(" \n\t\r") - begin + 1);
}

// The word after `key` in a header (up to a space or the next marker); empty when absent.
std::string_view WordAfter(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return {};
  std::string_view rest = header.substr(at + key.size());
  return rest.substr(0, std::min(rest.find(' '), rest.find("<|")));
}

// The longest tail of `text` that is a proper start of one of the body's end markers.
size_t PartialEnd(std::string_view text) {
  size_t longest = 0;
  for (std::string_view end : kEnds) {
    for (size_t n = std::min(end.size() - 1, text.size()); n > longest; --n) {
      if (text.substr(text.size() - n) == end.substr(0, n)) {
        longest = n;
        break;
      }
    }
  }
  return longest;
}

}  // namespace

bool IsHarmonyTemplate(std::string_view source) {
  return source.find(kChannel) != std::string_view::npos &&
         source.find(kMessage) != std::string_view::npos;
}

HarmonyParser::HarmonyParser(bool calls) : calls_(calls) {}

void HarmonyParser::Header(std::string_view header) {
  const std::string_view recipient = WordAfter(header, "to=");
  const std::string_view channel = WordAfter(header, kChannel);
  call_name_.clear();
  call_body_.clear();
  if (calls_ && !recipient.empty() && recipient != "assistant") {
    target_ = Target::kCall;
    call_name_ =
        std::string(recipient.starts_with("functions.") ? recipient.substr(10) : recipient);
  } else if (channel == "analysis") {
    target_ = Target::kReasoning;
  } else {
    target_ = Target::kContent;
  }
}

void HarmonyParser::Release(Pieces& out, std::string_view text) {
  switch (target_) {
    case Target::kReasoning:
      out.reasoning += text;
      break;
    case Target::kContent:
      out.content += text;
      break;
    case Target::kCall:
      call_body_ += text;
      break;
  }
}

void HarmonyParser::Run(Pieces& out, bool end) {
  for (;;) {
    if (!in_body_) {
      const size_t message = buffer_.find(kMessage);
      if (message != std::string::npos) {
        Header(std::string_view(buffer_).substr(0, message));
        buffer_.erase(0, message + kMessage.size());
        in_body_ = true;
        continue;
      }
      if (end || buffer_.size() > kLongestHeader) {
        // No header: text outside the format, less the end token that closed it.
        for (std::string_view marker : kEnds) {
          for (size_t at; (at = buffer_.find(marker)) != std::string::npos;) {
            buffer_.erase(at, marker.size());
          }
        }
        out.content += buffer_;
        buffer_.clear();
      }
      return;
    }
    size_t at = std::string::npos, length = 0;
    for (std::string_view marker : kEnds) {
      const size_t found = buffer_.find(marker);
      if (found < at) {
        at = found;
        length = marker.size();
      }
    }
    if (at == std::string::npos) {
      const size_t keep = end ? 0 : PartialEnd(buffer_);
      Release(out, std::string_view(buffer_).substr(0, buffer_.size() - keep));
      buffer_.erase(0, buffer_.size() - keep);
      if (end && target_ == Target::kCall) {
        out.content += call_body_;  // A call cut short: its text, never half a call.
        call_body_.clear();
      }
      return;
    }
    Release(out, std::string_view(buffer_).substr(0, at));
    buffer_.erase(0, at + length);
    in_body_ = false;
    if (target_ == Target::kCall) {
      // Arguments as JSON text of an object where the body is one (minified), else as written.
      simdjson::dom::parser parser;
      simdjson::dom::object object;
      const std::string_view body = Trim(call_body_);
      std::string arguments(body);
      if (parser.parse(body.data(), body.size()).get(object) == simdjson::SUCCESS) {
        arguments = simdjson::minify(object);
      }
      out.calls.push_back(ToolCall{NewToolCallId(), call_name_, std::move(arguments)});
      call_body_.clear();
    }
  }
}

HarmonyParser::Pieces HarmonyParser::Add(std::string_view text) {
  Pieces out;
  buffer_ += text;
  Run(out, /*end=*/false);
  return out;
}

HarmonyParser::Pieces HarmonyParser::Finish(bool closed) {
  Pieces out;
  if (closed && in_body_) buffer_ += kEnds[1];
  Run(out, /*end=*/true);
  return out;
}

std::string HarmonyReplyTag(const std::array<int32_t, kHarmonyMarkers.size()>& ids,
                            const std::vector<int32_t>& special,
                            const std::optional<std::string>& answer,
                            const std::vector<HarmonyCallSchema>& calls) {
  const int32_t start = ids[0], end = ids[1], message = ids[2], channel = ids[3],
                constrain = ids[4];
  JsonWriter json;
  const auto token = [&](int32_t id) {
    json.BeginObject().Field("type", "token").Field("token", int64_t{id}).EndObject();
  };
  const auto text = [&](std::string_view value) {
    json.BeginObject().Field("type", "const_string").Field("value", value).EndObject();
  };
  const auto free_text = [&] {  // Any tokens but the markers and the other special tokens.
    json.BeginObject().Field("type", "any_tokens").Key("exclude_tokens").BeginArray();
    for (const int32_t id : ids) json.Int(id);
    for (const int32_t id : special) {
      if (std::find(ids.begin(), ids.end(), id) == ids.end()) json.Int(id);
    }
    json.EndArray().EndObject();
  };
  const auto document = [&](const std::string& schema) {
    json.BeginObject().Field("type", "json_schema").Key("json_schema").Raw(schema).EndObject();
  };
  const auto sequence = [&] {
    json.BeginObject().Field("type", "sequence").Key("elements").BeginArray();
  };
  const auto close = [&] { json.EndArray().EndObject(); };
  json.BeginObject().Field("type", "structural_tag").Key("format");
  sequence();
  // <|channel|>analysis<|message|>...<|end|><|start|>assistant, or nothing.
  json.BeginObject().Field("type", "optional").Key("content");
  sequence();
  token(channel);
  text("analysis");
  token(message);
  free_text();
  token(end);
  token(start);
  text("assistant");
  close();
  json.EndObject();
  json.BeginObject().Field("type", "or").Key("elements").BeginArray();
  if (answer) {  // <|channel|>final<|message|> and the answer.
    sequence();
    token(channel);
    text("final");
    token(message);
    if (answer->empty()) {
      free_text();
    } else {
      document(*answer);
    }
    close();
  }
  for (const HarmonyCallSchema& call : calls) {
    sequence();
    token(channel);
    text("commentary to=functions." + call.name);
    json.BeginObject().Field("type", "optional").Key("content");
    text(" ");
    json.EndObject();
    token(constrain);
    text("json");
    token(message);
    document(call.schema);
    close();
  }
  json.EndArray().EndObject();
  close();
  json.EndObject();
  return json.str();
}

}  // namespace sluice::llm
