#include "http/llm_front.h"

#include <fmt/format.h>

#include <random>

#include "service/v2_service.h"

namespace sluice {

std::string SystemFingerprint(const llm::LlmEngine& engine) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a.
  for (const std::string& part :
       {std::string(kServerVersion), engine.model().weight_formats(), engine.model().kernel_paths(),
        engine.model().kv_cache_format()}) {
    for (const char c : part + '\0') {
      hash ^= static_cast<unsigned char>(c);
      hash *= 1099511628211ull;
    }
  }
  return fmt::format("fp_{:012x}", hash & 0xffffffffffffull);
}

std::string RandomId(std::string_view prefix) {
  static constexpr std::string_view kAlphabet =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 random{std::random_device{}()};
  std::uniform_int_distribution<size_t> pick(0, kAlphabet.size() - 1);
  std::string id(prefix);
  for (int i = 0; i < 24; ++i) id += kAlphabet[pick(random)];
  return id;
}

namespace {

// A request waiting for its model's load: its answer, and its link to the client (whether the
// client left; the cancel of what the second run started).
struct ParkedRequest {
  Mutex mu;
  Responder respond GUARDED_BY(mu);
  bool gone GUARDED_BY(mu) = false;
  std::function<void()> cancel GUARDED_BY(mu);
};

}  // namespace

bool WaitForLoad(const llm::GenerationService& service, const Status& status,
                 const std::string& model, const HttpRequest& request, Responder& respond,
                 LoadWaitHandler handle) {
  if (status.code() != StatusCode::kUnavailable || request.waited_for_load || !request.post) {
    return false;
  }
  auto parked = std::make_shared<ParkedRequest>();
  // The copy holds the body, its memory reservation and its admission ticket while it waits.
  auto again = std::make_shared<HttpRequest>(request);
  again->waited_for_load = true;
  again->on_disconnect = [parked](std::function<void()> cancel) {
    {
      MutexLock lock(parked->mu);
      if (!parked->gone) {
        parked->cancel = std::move(cancel);
        return;
      }
    }
    cancel();
  };
  {
    MutexLock lock(parked->mu);
    parked->respond = std::move(respond);
  }
  auto resume = [parked, again, handle = std::move(handle)] {
    const Poster post = again->post;
    post([parked, again, handle] {
      Responder answer;
      bool gone;
      {
        MutexLock lock(parked->mu);
        answer = std::move(parked->respond);
        gone = parked->gone;
      }
      if (gone) {
        return answer(
            HttpResponse::Error(Status::Cancelled("the client left while its model loaded")));
      }
      handle(*again, std::move(answer));
    });
  };
  if (!service.WhenLoaded(model, std::move(resume))) {
    MutexLock lock(parked->mu);
    respond = std::move(parked->respond);
    return false;
  }
  if (request.on_disconnect) {
    request.on_disconnect([parked] {
      std::function<void()> cancel;
      {
        MutexLock lock(parked->mu);
        parked->gone = true;
        cancel = std::move(parked->cancel);
      }
      if (cancel) cancel();
    });
  }
  return true;
}

namespace {

// The bytes an event's rendering is expected to take, counted against the stream's bound until
// the connection takes it: its text, and the JSON around it.
size_t RenderedSize(const llm::ChoiceEvent& event) {
  size_t size = 512 + event.content.size() + event.reasoning.size() + event.stop_string.size();
  for (const llm::ToolCall& call : event.tool_calls) {
    size += 128 + call.id.size() + call.name.size() + 2 * call.arguments.size();
  }
  for (const llm::TokenLogprobs& token : event.logprobs) size += 96 * (1 + token.top.size());
  return size;
}

}  // namespace

void FrontReply::OnChoice(const llm::ChoiceEvent& event) {
  if (failed_) return;
  if (event.finish != llm::FinishReason::kNone) --unfinished_;
  const bool last = unfinished_ == 0;
  if (stream) {
    auto render = [writer = writer_, event, last] { return writer->StreamChoice(event, last); };
    if (!stream->Post(std::move(render), RenderedSize(event))) return Cancel();
    if (last) stream->Close();
    return;
  }
  writer_->Add(event);
  if (last) Answer(HttpResponse::RenderedJson(200, [writer = writer_] { return writer->Body(); }));
}

void FrontReply::OnFailed(const Status& error) {
  failed_ = true;
  if (!stream) return Answer(Error(error, {}, 0));
  // Headers are sent (or will be): the error travels as events, then the stream ends.
  stream->Post([writer = writer_, error] { return writer->StreamFailure(error); },
               512 + error.message().size());
  stream->Close();
}

}  // namespace sluice
