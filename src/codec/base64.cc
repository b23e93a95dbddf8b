// Base64 codec.
#include "codec/base64.h"

#include <fmt/format.h>

#include <array>

namespace sluice {
namespace {

constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> MakeDecodeTable() {
  std::array<int8_t, 256> table{};
  for (auto& v : table) v = -1;
  for (int i = 0; i < 64; ++i)
    table[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return table;
}
constexpr std::array<int8_t, 256> kDecode = MakeDecodeTable();

}  // namespace

Result<std::string> Base64Decode(std::string_view text) {
  if (text.substr(0, 5) == "data:") {
    size_t comma = text.find(";base64,");
    if (comma == std::string_view::npos) {
      return Status::InvalidArgument("a data: URL must be base64 (\";base64,\")");
    }
    text.remove_prefix(comma + 8);
  }
  size_t length = text.size();
  while (length > 0 && text[length - 1] == '=' && text.size() - length < 2) --length;
  if (length % 4 == 1) {
    return Status::InvalidArgument(
        fmt::format("invalid base64: length {} cannot be a base64 encoding", text.size()));
  }
  std::string out;
  out.reserve(length / 4 * 3 + 2);
  uint32_t bits = 0;
  int count = 0;
  for (size_t i = 0; i < length; ++i) {
    int8_t v = kDecode[static_cast<unsigned char>(text[i])];
    if (v < 0) {
      return Status::InvalidArgument(fmt::format("invalid base64: bad character at offset {}", i));
    }
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if (++count == 4) {
      out.push_back(static_cast<char>(bits >> 16));
      out.push_back(static_cast<char>(bits >> 8));
      out.push_back(static_cast<char>(bits));
      bits = 0;
      count = 0;
    }
  }
  if (count == 2) {
    out.push_back(static_cast<char>(bits >> 4));
  } else if (count == 3) {
    out.push_back(static_cast<char>(bits >> 10));
    out.push_back(static_cast<char>(bits >> 2));
  }
  return out;
}

std::string Base64Encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    uint32_t v = (static_cast<uint8_t>(bytes[i]) << 16) |
                 (static_cast<uint8_t>(bytes[i + 1]) << 8) | static_cast<uint8_t>(bytes[i + 2]);
    out.push_back(kAlphabet[v >> 18]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  if (i < bytes.size()) {
    uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) v |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    out.push_back(kAlphabet[v >> 18]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

}  // namespace sluice
