// Hand-offs gathered per batch. While a HandOffBatch is open on a thread, the work that thread
// hands to another thread's queue through a Sink is held, and each sink gets its share in one
// delivery when the batch closes: a batch of completions handed to an I/O thread wakes it once,
// not once per request. A batch opened in place holds one piece of work that nothing on its
// thread waits behind: whoever hands it off may run it right there instead (InPlace()).
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
  // delivers, and its `in_place` counts.
  explicit HandOffBatch(bool in_place = false);
  // Delivers what was gathered: one Deliver per sink, in the order each sink was first used.
  ~HandOffBatch();
  HandOffBatch(const HandOffBatch&) = delete;
  HandOffBatch& operator=(const HandOffBatch&) = delete;

  // With a batch open on this thread, takes `work` for `sink` and returns true. With none, returns
  // false and leaves `work` to the caller to hand off itself.
  static bool Gather(Sink& sink, std::function<void()>& work);
  // Whether a batch open on this thread was opened in place: the work handed off may run on this
  // thread, at once, where its owner can do so safely.
  static bool InPlace();

 private:
  const bool outer_;
  const bool in_place_;
  std::vector<std::pair<Sink*, std::vector<std::function<void()>>>> gathered_;
};

}  // namespace sluice
