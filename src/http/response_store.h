// The Responses API's store: responses kept (store: true, OpenAI's default) so that
// previous_response_id continues their conversation and GET / DELETE /v1/responses/{id} find
// them. Bounded in count and in bytes (the server's --responses-store-max and
// --responses-store-bytes): the least recently used go first, never unbounded. In memory: a
// restart forgets them.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "llm/text/chat_template.h"

namespace sluice {

struct StoredResponse {
  std::string id;
  std::string model;
  std::string body;  // The response object, as GET returns it.
  // The conversation to continue: the input (its history included, the instructions not: they
  // do not carry over) and this response's output, as chat messages.
  std::vector<llm::ChatMessage> conversation;
  // This request's input items as JSON objects, each with its id (GET .../input_items).
  std::vector<std::string> input_items;
};

// Thread-safe.
class ResponseStore {
 public:
  ResponseStore(size_t max_count, size_t max_bytes)
      : max_count_(max_count), max_bytes_(max_bytes) {}

  // Keeps `response`, then lets the least recently used go until both bounds hold. One larger
  // than max_bytes alone is not kept (false).
  bool Put(StoredResponse response);
  // Null where not stored (never, deleted, or let go); a hit counts as a use.
  std::shared_ptr<const StoredResponse> Get(const std::string& id);
  bool Delete(const std::string& id);

  size_t size() const;
  size_t bytes() const;
  // What a response takes, as the bound counts it.
  static size_t BytesOf(const StoredResponse& response);

 private:
  using Entry = std::shared_ptr<const StoredResponse>;
  const size_t max_count_, max_bytes_;
  mutable Mutex mu_;
  std::list<Entry> order_ GUARDED_BY(mu_);  // Most recently used first.
  std::unordered_map<std::string, std::list<Entry>::iterator> index_ GUARDED_BY(mu_);
  size_t bytes_ GUARDED_BY(mu_) = 0;
};

}  // namespace sluice
