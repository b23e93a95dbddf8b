// The OpenAI-style model listing: /v1/models and /v1/models/{model}, the models served (with
// their LoRA adapters, as vLLM lists them) and those a request may load on demand, each with its
// state. openai_handlers.cc holds the generating routes.
#include <fmt/format.h>

#include <algorithm>

#include "common/json_writer.h"
#include "http/openai_handlers.h"

namespace sluice {

void OpenAiHandlers::WriteModel(JsonWriter& json, const std::string& id, const std::string& parent,
                                const llm::LlmEngine& engine) const {
  json.BeginObject().Field("id", id).Field("object", "model").Field("created", created_);
  json.Field("owned_by", "sluice");
  if (!parent.empty()) json.Field("parent", parent);
  json.Field("max_model_len", int64_t{engine.model().context_length()});
  // As llama.cpp's router lists its models: loaded, or (below) one it would load on demand.
  json.Key("status").BeginObject().Field("value", "loaded").EndObject();
  json.EndObject();
}

void OpenAiHandlers::WriteUnloadedModel(JsonWriter& json, const std::string& id,
                                        const std::string& state) const {
  json.BeginObject().Field("id", id).Field("object", "model").Field("created", created_);
  json.Field("owned_by", "sluice");
  json.Key("status").BeginObject().Field("value", state).EndObject();
  json.EndObject();
}

void OpenAiHandlers::Models(const HttpRequest&, const PathParams&, Responder respond) {
  JsonWriter json;
  json.BeginObject().Field("object", "list").Key("data").BeginArray();
  for (const auto& [name, engine] : service_.models()) {
    WriteModel(json, name, "", *engine);
    // Its LoRA adapters, as vLLM lists them: each with its base model as `parent`.
    for (const std::string& adapter : engine->AdapterNames()) {
      WriteModel(json, adapter, name, *engine);
    }
  }
  for (const auto& [name, state] : service_.Unloaded()) WriteUnloadedModel(json, name, state);
  json.EndArray().EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::Model(const HttpRequest&, const PathParams& params, Responder respond) {
  const std::string id(params.Get("model"));
  for (const auto& [name, engine] : service_.models()) {
    JsonWriter json;
    if (name == id) {
      WriteModel(json, name, "", *engine);
    } else {
      const std::vector<std::string> adapters = engine->AdapterNames();
      if (std::find(adapters.begin(), adapters.end(), id) == adapters.end()) continue;
      WriteModel(json, id, name, *engine);
    }
    return respond(HttpResponse::Json(200, json.str()));
  }
  for (const auto& [name, state] : service_.Unloaded()) {
    if (name != id) continue;
    JsonWriter json;
    WriteUnloadedModel(json, name, state);
    return respond(HttpResponse::Json(200, json.str()));
  }
  respond(OpenAiError(Status::NotFound(fmt::format("The model '{}' does not exist", id)), "model"));
}

}  // namespace sluice
