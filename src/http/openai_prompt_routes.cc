// The OpenAI-style routes that stop at the prompt: vLLM's /tokenize and /detokenize, and its
// render routes (the prompt's token ids and sampling as a generation would run them, not run).
// openai_handlers.cc holds the generating routes, embeddings, reranking and adapters;
// openai_model_routes.cc the model listing.
#include <fmt/format.h>

#include "common/json_writer.h"
#include "http/openai_handlers.h"
#include "http/openai_request.h"

namespace sluice {

using openai::CompletionRequest;

void OpenAiHandlers::Tokenize(const HttpRequest& request, const PathParams&, Responder respond) {
  openai::TokenizeRequest parsed;
  if (auto error = openai::ParseTokenize(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  std::shared_ptr<const llm::LoraAdapter> adapter;  // Its base model's tokenizer.
  auto engine = service_.Find(parsed.model, &adapter);
  if (!engine.ok()) {
    if (WaitForLoad(service_, engine.status(), parsed.model, request, respond,
                    RunAgain(this, &OpenAiHandlers::Tokenize))) {
      return;
    }
    return respond(OpenAiError(engine.status(), "model"));
  }

  if (parsed.chat) {
    auto rendered =
        llm::GenerationService::RenderChat(**engine, parsed.messages, parsed.add_generation_prompt);
    if (!rendered.ok()) return respond(OpenAiError(rendered.status(), "messages"));
    parsed.prompt = std::move(*rendered);
  }
  const std::vector<int32_t> ids =
      (*engine)->tokenizer().Encode(parsed.prompt, parsed.add_special_tokens);
  JsonWriter json;
  json.BeginObject().Field("count", static_cast<int64_t>(ids.size()));
  json.Field("max_model_len", int64_t{(*engine)->model().context_length()});
  json.Key("tokens").BeginArray();
  for (int32_t id : ids) json.Int(id);
  json.EndArray().EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::Detokenize(const HttpRequest& request, const PathParams&, Responder respond) {
  openai::DetokenizeRequest parsed;
  if (auto error = openai::ParseDetokenize(request.body, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto engine = service_.Find(parsed.model);
  if (!engine.ok()) {
    if (WaitForLoad(service_, engine.status(), parsed.model, request, respond,
                    RunAgain(this, &OpenAiHandlers::Detokenize))) {
      return;
    }
    return respond(OpenAiError(engine.status(), "model"));
  }

  const int64_t vocab = (*engine)->model().architecture().vocab_size;
  std::vector<int32_t> ids;
  for (const int64_t id : parsed.tokens) {
    if (id < 0 || id >= vocab) {
      return respond(OpenAiError(
          Status::InvalidArgument(fmt::format(
              "'tokens' must hold token ids in [0, {}) of model '{}'", vocab, parsed.model)),
          "tokens"));
    }
    ids.push_back(static_cast<int32_t>(id));
  }
  JsonWriter json;
  json.BeginObject().Field("prompt", (*engine)->tokenizer().Decode(ids)).EndObject();
  respond(HttpResponse::Json(200, json.str()));
}

void OpenAiHandlers::RenderChatCompletion(const HttpRequest& request, const PathParams&,
                                          Responder respond) {
  Render(request, /*chat=*/true, std::move(respond));
}

void OpenAiHandlers::RenderCompletion(const HttpRequest& request, const PathParams&,
                                      Responder respond) {
  Render(request, /*chat=*/false, std::move(respond));
}

// What a request would run, without running it, as vLLM's render endpoints give it to routers
// that choose a replica by its prompt's tokens (llm-d, Dynamo): a GenerateRequest with the prompt's
// token ids and the sampling Sluice applies (max_tokens resolved as the request would run). The
// request is checked as the generating endpoint checks it: what that refuses, this refuses with
// the same error. A chat gives one object, a completion a list (one per prompt).
void OpenAiHandlers::Render(const HttpRequest& request, bool chat, Responder respond) {
  CompletionRequest parsed;
  if (auto error = openai::ParseCompletion(request.body, chat, parsed)) {
    return respond(OpenAiError(Status::InvalidArgument(error->message), error->param));
  }
  auto found = service_.Find(parsed.model, &parsed.adapter);
  if (!found.ok()) {
    auto again = [this, chat](const HttpRequest& r, Responder d) {
      Render(r, chat, std::move(d));
    };
    if (WaitForLoad(service_, found.status(), parsed.model, request, respond, again)) return;
    return respond(OpenAiError(found.status(), "model"));
  }
  std::string param;
  auto prepared = llm::GenerationService::PreparePrompt(**found, parsed, &param);
  if (!prepared.ok()) return respond(OpenAiError(prepared.status(), param));
  JsonWriter json;
  if (!chat) json.BeginArray();
  json.BeginObject();
  json.Field("request_id",
             fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", NextReplyId()));
  json.Key("token_ids").BeginArray();
  for (const int32_t id : prepared->tokens) json.Int(id);
  json.EndArray().Key("features").Null();
  const llm::SamplingParams& sampling = parsed.sampling;
  json.Key("sampling_params").BeginObject().Field("n", parsed.n);
  json.Field("temperature", sampling.temperature).Field("top_p", sampling.top_p);
  json.Field("top_k", sampling.top_k).Key("seed");
  if (sampling.seed.has_value()) {
    json.Int(static_cast<int64_t>(*sampling.seed));
  } else {
    json.Null();
  }
  json.Field("repetition_penalty", sampling.repetition_penalty);
  json.Field("frequency_penalty", sampling.frequency_penalty);
  json.Field("presence_penalty", sampling.presence_penalty);
  json.Field("max_tokens", prepared->max_tokens).Key("stop").BeginArray();
  for (const std::string& stop : parsed.stop) json.String(stop);
  json.EndArray().Field("ignore_eos", parsed.ignore_eos).Key("logprobs");
  if (parsed.top_logprobs >= 0) {
    json.Int(parsed.top_logprobs);
  } else {
    json.Null();
  }
  json.EndObject();
  json.Field("model", parsed.model).Field("stream", parsed.stream).EndObject();
  if (!chat) json.EndArray();
  respond(HttpResponse::Json(200, json.str()));
}

}  // namespace sluice
