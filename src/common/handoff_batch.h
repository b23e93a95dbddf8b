// Hand-offs gathered per batch. While a HandOffBatch is open on a thread, the work that thread
// hands to another thread's queue through a Sink is held, and each sink gets its share in one
// delivery when the batch closes: a batch of completions handed to an I/O thread wakes it once,
// not once per request.
#pragma once

#include <functional>
#include <utility>
#include <vector>

namespace sluice {

class HandOffBatch {
 public:
  // A queue served by another thread.
  class Sink {
   public:
    virtual ~Sink() = default;
    // Runs every one of `works`, in order, on the sink's thread.
    virtual void Deliver(std::vector<std::function<void()>> works) = 0;
  };

  // Opens a batch on this thread. One opened while another is open joins it: the outer one
  // delivers.
  HandOffBatch();
  // Delivers what was gathered: one Deliver per sink, in the order each sink was first used.
  ~HandOffBatch();
  HandOffBatch(const HandOffBatch&) = delete;
  HandOffBatch& operator=(const HandOffBatch&) = delete;

  // With a batch open on this thread, takes `work` for `sink` and returns true. With none, returns
  // false and leaves `work` to the caller to hand off itself.
  static bool Gather(Sink& sink, std::function<void()>& work);

 private:
  const bool outer_;
  std::vector<std::pair<Sink*, std::vector<std::function<void()>>>> gathered_;
};

}  // namespace sluice
