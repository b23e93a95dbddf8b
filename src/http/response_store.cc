#include "http/response_store.h"

namespace sluice {

size_t ResponseStore::BytesOf(const StoredResponse& response) {
  size_t bytes = sizeof(StoredResponse) + response.id.size() + response.model.size() +
                 response.body.size() + 2 * response.id.size();  // The index's key and node.
  for (const llm::ChatMessage& m : response.conversation) {
    bytes += sizeof(m) + m.role.size() + m.content.size() + m.name.size() + m.tool_call_id.size() +
             m.reasoning_content.size();
    for (const llm::ToolCallRecord& call : m.tool_calls) {
      bytes += sizeof(call) + call.id.size() + call.name.size() + call.arguments.size();
    }
  }
  for (const std::string& item : response.input_items) bytes += sizeof(item) + item.size();
  return bytes;
}

bool ResponseStore::Put(StoredResponse response) {
  const size_t bytes = BytesOf(response);
  if (bytes > max_bytes_ || max_count_ == 0) return false;
  auto entry = std::make_shared<const StoredResponse>(std::move(response));
  MutexLock lock(mu_);
  if (auto it = index_.find(entry->id); it != index_.end()) {
    bytes_ -= BytesOf(**it->second);
    order_.erase(it->second);
    index_.erase(it);
  }
  order_.push_front(entry);
  index_[entry->id] = order_.begin();
  bytes_ += bytes;
  while (order_.size() > max_count_ || bytes_ > max_bytes_) {
    const Entry& oldest = order_.back();
    bytes_ -= BytesOf(*oldest);
    index_.erase(oldest->id);
    order_.pop_back();
  }
  return true;
}

std::shared_ptr<const StoredResponse> ResponseStore::Get(const std::string& id) {
  MutexLock lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return nullptr;
  order_.splice(order_.begin(), order_, it->second);
  return *it->second;
}

bool ResponseStore::Delete(const std::string& id) {
  MutexLock lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end()) return false;
  bytes_ -= BytesOf(**it->second);
  order_.erase(it->second);
  index_.erase(it);
  return true;
}

size_t ResponseStore::size() const {
  MutexLock lock(mu_);
  return order_.size();
}

size_t ResponseStore::bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

}  // namespace sluice
