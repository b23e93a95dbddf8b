// Hand-offs gathered per batch.
#include "common/handoff_batch.h"

namespace sluice {
namespace {

thread_local HandOffBatch* g_open = nullptr;  // The outermost batch open on this thread.

}  // namespace

HandOffBatch::HandOffBatch(bool in_place) : outer_(g_open == nullptr), in_place_(in_place) {
  if (outer_) g_open = this;
}

HandOffBatch::~HandOffBatch() {
  if (!outer_) return;
  g_open = nullptr;  // A sink that hands off again while delivering does so at once.
  for (auto& [sink, works] : gathered_) sink->Deliver(std::move(works));
}

bool HandOffBatch::Gather(Sink& sink, std::function<void()>& work) {
  if (g_open == nullptr) return false;
  auto& gathered = g_open->gathered_;
  auto it = gathered.begin();
  while (it != gathered.end() && it->first != &sink) ++it;
  if (it == gathered.end()) it = gathered.insert(it, {&sink, {}});
  it->second.push_back(std::move(work));
  return true;
}

bool HandOffBatch::InPlace() { return g_open != nullptr && g_open->in_place_; }

}  // namespace sluice
