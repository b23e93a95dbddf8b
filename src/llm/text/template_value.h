// The values a chat template computes with (Jinja's: undefined, none, booleans, integers, floats,
// strings, lists and dicts that keep their keys in order, as Python's do), JSON documents turned
// into them, and their text: str() and Python's json.dumps (transformers' tojson filter).
// Internal to the chat template (chat_template.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace sluice::llm::jinja {

struct Value;
class Dict;
using List = std::vector<Value>;
struct Undefined {};

struct Value {
  std::variant<Undefined, std::nullptr_t, bool, int64_t, double, std::string, std::shared_ptr<List>,
               std::shared_ptr<Dict>>
      v;
  Value() = default;
  Value(std::nullptr_t) : v(nullptr) {}                       // NOLINT
  Value(bool b) : v(b) {}                                     // NOLINT
  Value(int64_t i) : v(i) {}                                  // NOLINT
  Value(double d) : v(d) {}                                   // NOLINT
  Value(std::string s) : v(std::move(s)) {}                   // NOLINT
  Value(const char* s) : v(std::string(s)) {}                 // NOLINT
  Value(List l) : v(std::make_shared<List>(std::move(l))) {}  // NOLINT
  Value(Dict d);                                              // NOLINT

  bool undefined() const { return std::holds_alternative<Undefined>(v); }
  bool none() const { return std::holds_alternative<std::nullptr_t>(v); }
  const std::string* str() const { return std::get_if<std::string>(&v); }
  const int64_t* integer() const { return std::get_if<int64_t>(&v); }
  const double* real() const { return std::get_if<double>(&v); }
  List* list() const {
    auto p = std::get_if<std::shared_ptr<List>>(&v);
    return p ? p->get() : nullptr;
  }
  Dict* dict() const {
    auto p = std::get_if<std::shared_ptr<Dict>>(&v);
    return p ? p->get() : nullptr;
  }
  bool Truthy() const;
};

// A mapping that keeps its keys in insertion order, as Python's dict (and so tojson) does.
class Dict {
 public:
  using Entry = std::pair<std::string, Value>;
  Dict() = default;
  Dict(std::initializer_list<Entry> entries) {
    for (const Entry& e : entries) (*this)[e.first] = e.second;
  }
  Value& operator[](const std::string& key) {
    auto it = find(key);
    if (it != entries_.end()) return it->second;
    return entries_.emplace_back(key, Value()).second;
  }
  std::vector<Entry>::iterator find(const std::string& key) {
    return std::find_if(entries_.begin(), entries_.end(),
                        [&](const Entry& e) { return e.first == key; });
  }
  std::vector<Entry>::const_iterator find(const std::string& key) const {
    return std::find_if(entries_.begin(), entries_.end(),
                        [&](const Entry& e) { return e.first == key; });
  }
  size_t count(const std::string& key) const { return find(key) == end() ? 0 : 1; }
  void emplace(const std::string& key, Value value) {
    if (find(key) == end()) entries_.emplace_back(key, std::move(value));
  }
  std::vector<Entry>::iterator begin() { return entries_.begin(); }
  std::vector<Entry>::iterator end() { return entries_.end(); }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }

 private:
  std::vector<Entry> entries_;
};

// A JSON document's value; text that is not JSON stays that text.
Value ParseJsonValue(const std::string& text);
// str(value): Python's text of a value (True, None, 0.5; lists and dicts as JSON).
std::string ToText(const Value& value);
// Python's json.dumps(value, ensure_ascii=False), appended to `out` (its own string escapes, not
// JsonQuote's, which also escapes DEL).
void WritePythonJson(const Value& value, std::string& out);
// Jinja's ==.
bool Equal(const Value& a, const Value& b);

}  // namespace sluice::llm::jinja
