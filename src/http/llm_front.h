// What every language-model front (OpenAI's chat and completions, the Responses API, Anthropic's
// Messages API) needs around a generation: one answer per request, whichever of its result and a
// disconnect comes first, and the generation stopped when its client leaves.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/mutex.h"
#include "http/router.h"
#include "llm/generation_service.h"

namespace sluice {

// OpenAI's system_fingerprint: "fp_" and a hash of what changes a model's outputs for one seed
// (the server's version, the weights' formats, the kernels, the KV cache's format).
std::string SystemFingerprint(const llm::LlmEngine& engine);

inline int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// A generation to stop when its client leaves, whether the client leaves before it started
// (Cancel, then Attach) or after. Weak: the generation holds its observer, and so the response,
// until its last event; a strong pointer back would keep both, and the connection, forever.
class CancelLink {
 public:
  void Attach(const std::shared_ptr<llm::Generation>& generation) {
    {
      MutexLock lock(mu_);
      generation_ = generation;
      if (!cancelled_) return;
    }
    generation->Cancel();
  }
  // True the first time.
  bool Cancel() {
    std::shared_ptr<llm::Generation> generation;
    {
      MutexLock lock(mu_);
      if (cancelled_) return false;
      cancelled_ = true;
      generation = generation_.lock();
    }
    if (generation) generation->Cancel();
    return true;
  }

 private:
  Mutex mu_;
  std::weak_ptr<llm::Generation> generation_ GUARDED_BY(mu_);
  bool cancelled_ GUARDED_BY(mu_) = false;
};

// A route's one answer, whichever of its result and a disconnect comes first.
inline std::function<void(HttpResponse)> AnswerOnce(Responder respond) {
  auto answered = std::make_shared<std::atomic<bool>>(false);
  return [answered, respond = std::move(respond)](HttpResponse response) {
    if (!answered->exchange(true)) respond(std::move(response));
  };
}

// What every front's reply to a generation shares: exactly one answer (an error, a body, or a
// stream begun once every choice is queued), and the generation stopped when the client leaves.
// The front gives its error shape (Error) and writes its events (OnChoice, OnFailed).
class FrontReply : public llm::GenerationObserver {
 public:
  Responder respond;
  std::shared_ptr<ResponseStream> stream;  // `stream: true`; else the reply is one body.

  // The generation to stop when the client leaves (set once Start returns).
  void Attach(const std::shared_ptr<llm::Generation>& generation) { link_.Attach(generation); }

  // The client left. A reply not yet streaming answers it (the server counts a client that
  // left); a stream's end is the server's own.
  void Cancel() {
    if (!link_.Cancel()) return;
    if (!stream) Answer(Error(Status::Cancelled("the client disconnected"), {}, 0));
  }

  void OnRejected(const Status& status, std::string_view param,
                  double retry_after_seconds) override {
    Answer(Error(status, param, retry_after_seconds));
  }

  void OnAccepted() override {
    if (!stream) return;
    HttpResponse response;
    response.content_type = "text/event-stream";
    response.headers.emplace_back("Cache-Control", "no-cache");
    response.stream = stream;
    Answer(std::move(response));
  }

 protected:
  // The front's error response for `status` (`param`: the request parameter at fault).
  virtual HttpResponse Error(const Status& status, std::string_view param,
                             double retry_after_seconds) const = 0;

  // Exactly one answer, whichever of the generation and a disconnect comes first.
  void Answer(HttpResponse response) {
    if (!answered_.exchange(true)) respond(std::move(response));
  }

 private:
  CancelLink link_;
  std::atomic<bool> answered_{false};
};

}  // namespace sluice
