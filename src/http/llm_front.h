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

// `prefix` and 24 random letters and digits, as OpenAI's and Anthropic's ids look (resp_, msg_,
// rs_, fc_, fco_).
std::string RandomId(std::string_view prefix);

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

// A request whose model Find() answered kUnavailable (`status`) waits for the model's load where
// the service lets it (GenerationService::WhenLoaded): true when it does, `respond` then taken and
// `handle` run again with a copy of the request, on its connection's thread, once the load has
// run or the wait has passed (the copy waits no more: Find's answer then stands). A client that
// leaves meanwhile is answered kCancelled without a second run. False: answer `status` now.
using LoadWaitHandler = std::function<void(const HttpRequest&, Responder)>;
bool WaitForLoad(const llm::GenerationService& service, const Status& status,
                 const std::string& model, const HttpRequest& request, Responder& respond,
                 LoadWaitHandler handle);

// A route of `front` (one whose path has no parameters) as WaitForLoad runs it again.
template <typename Front>
LoadWaitHandler RunAgain(Front* front,
                         void (Front::*route)(const HttpRequest&, const PathParams&, Responder)) {
  return [front, route](const HttpRequest& request, Responder respond) {
    (front->*route)(request, PathParams{}, std::move(respond));
  };
}

// One reply's writer: the generation service's events made into a front's JSON, off the engine's
// loop. A streamed reply's events are rendered on the connection's I/O thread as it takes them
// from the stream (StreamChoice, StreamFailure: one at a time, in the events' order); a whole
// reply's parts are kept on the engine's loop as they come (Add: no JSON) and its body rendered on
// the I/O thread once the last is kept (Body). A writer is touched by one thread at a time and
// needs no lock.
class EventWriter {
 public:
  virtual ~EventWriter() = default;
  // A streamed reply: the text of the events for `event`; `last`: the reply's last event.
  virtual std::string StreamChoice(const llm::ChoiceEvent& event, bool last) = 0;
  // A streamed reply whose model failed after its head was sent: the error's events.
  virtual std::string StreamFailure(const Status& error) = 0;
  // A whole reply: one event's parts, kept ...
  virtual void Add(const llm::ChoiceEvent& event) = 0;
  // ... and, after the last, the body.
  virtual std::string Body() = 0;
};

// What every front's reply to a generation shares: exactly one answer (an error, a body, or a
// stream begun once every choice is queued), and the generation stopped when the client leaves.
// The front gives its error shape (Error) and its writer. Events arrive on the engine's loop
// thread; a disconnect on the I/O thread.
class FrontReply : public llm::GenerationObserver {
 public:
  // `choices`: how many choices end before the reply does (OpenAI's n).
  FrontReply(std::shared_ptr<EventWriter> writer, int choices)
      : writer_(std::move(writer)), unfinished_(choices) {}

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

  void OnChoice(const llm::ChoiceEvent& event) final;
  void OnFailed(const Status& error) final;

 protected:
  // The front's error response for `status` (`param`: the request parameter at fault).
  virtual HttpResponse Error(const Status& status, std::string_view param,
                             double retry_after_seconds) const = 0;

 private:
  // Exactly one answer, whichever of the generation and a disconnect comes first.
  void Answer(HttpResponse response) {
    if (!answered_.exchange(true)) respond(std::move(response));
  }

  const std::shared_ptr<EventWriter> writer_;
  CancelLink link_;
  std::atomic<bool> answered_{false};
  // Engine thread only.
  int unfinished_ = 0;
  bool failed_ = false;
};

}  // namespace sluice
