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

}  // namespace sluice
