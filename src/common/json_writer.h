// A small streaming JSON writer for result files and responses.
//
// simdjson (our parser) does not write JSON; this covers the little writing Sluice does, with
// correct string escaping and round-trippable numbers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sluice {

// Thread-compatible. Commas are inserted automatically; the caller balances Begin/End.
class JsonWriter {
 public:
  JsonWriter& BeginObject();
  JsonWriter& EndObject();
  JsonWriter& BeginArray();
  JsonWriter& EndArray();
  JsonWriter& Key(std::string_view key);
  JsonWriter& String(std::string_view value);
  JsonWriter& Int(int64_t value);
  // NaN and infinities have no JSON form and are written as null.
  JsonWriter& Double(double value);
  JsonWriter& Bool(bool value);
  JsonWriter& Null();
  // `json`, a value already written as JSON (the caller vouches for it), as it is.
  JsonWriter& Raw(std::string_view json);

  // Key() followed by a value.
  template <typename T>
  JsonWriter& Field(std::string_view key, const T& value) {
    Key(key);
    return Value(value);
  }

  const std::string& str() const { return out_; }

 private:
  JsonWriter& Value(std::string_view v) { return String(v); }
  JsonWriter& Value(const std::string& v) { return String(v); }
  JsonWriter& Value(const char* v) { return String(v); }
  JsonWriter& Value(bool v) { return Bool(v); }
  JsonWriter& Value(int v) { return Int(v); }
  JsonWriter& Value(int64_t v) { return Int(v); }
  JsonWriter& Value(uint64_t v) { return Int(static_cast<int64_t>(v)); }
  JsonWriter& Value(double v) { return Double(v); }

  void BeforeValue();

  std::string out_;
  std::vector<bool> first_in_scope_;  // One entry per open object/array.
  bool after_key_ = false;
};

// `s` as a quoted JSON string, escaped. Invalid UTF-8 bytes become U+FFFD.
std::string JsonQuote(std::string_view s);

}  // namespace sluice
