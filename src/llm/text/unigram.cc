#include "llm/text/unigram.h"

#include <fmt/format.h>
#include <unicode/ubrk.h>
#include <unicode/uchar.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>

namespace sluice::llm {

namespace {

constexpr const char* kSpace = "\xE2\x96\x81";  // "▁"

// darts-clone's double-array unit.
bool HasLeaf(uint32_t unit) { return ((unit >> 8) & 1) != 0; }
uint32_t Value(uint32_t unit) { return unit & ((1u << 31) - 1); }
uint32_t Label(uint32_t unit) { return unit & ((1u << 31) | 0xFF); }
uint32_t Offset(uint32_t unit) { return (unit >> 10) << ((unit & (1u << 9)) >> 6); }

int Utf8Length(unsigned char lead) {
  if (lead < 0x80) return 1;
  if ((lead & 0xE0) == 0xC0) return 2;
  if ((lead & 0xF0) == 0xE0) return 3;
  if ((lead & 0xF8) == 0xF0) return 4;
  return 1;
}

// The grapheme clusters of `text` (extended, as Rust's unicode-segmentation gives them), as byte
// ranges.
std::vector<std::string_view> Graphemes(std::string_view text) {
  std::vector<std::string_view> out;
  std::u16string utf16;
  std::vector<int32_t> byte_of;  // UTF-16 index -> byte offset.
  for (int32_t i = 0; i < static_cast<int32_t>(text.size());) {
    const int32_t start = i;
    UChar32 cp = 0;
    U8_NEXT(reinterpret_cast<const uint8_t*>(text.data()), i, static_cast<int32_t>(text.size()),
            cp);
    if (cp < 0) cp = 0xFFFD;
    if (U_IS_BMP(cp)) {
      utf16.push_back(static_cast<char16_t>(cp));
      byte_of.push_back(start);
    } else {
      utf16.push_back(static_cast<char16_t>(U16_LEAD(cp)));
      utf16.push_back(static_cast<char16_t>(U16_TRAIL(cp)));
      byte_of.push_back(start);
      byte_of.push_back(start);
    }
  }
  byte_of.push_back(static_cast<int32_t>(text.size()));
  UErrorCode status = U_ZERO_ERROR;
  UBreakIterator* it =
      ubrk_open(UBRK_CHARACTER, "", utf16.data(), static_cast<int32_t>(utf16.size()), &status);
  if (U_FAILURE(status)) {  // Each character its own cluster.
    for (size_t i = 0; i < text.size();) {
      const auto n = static_cast<size_t>(Utf8Length(static_cast<unsigned char>(text[i])));
      out.push_back(text.substr(i, n));
      i += n;
    }
    return out;
  }
  int32_t begin = ubrk_first(it);
  for (int32_t end = ubrk_next(it); end != UBRK_DONE; begin = end, end = ubrk_next(it)) {
    const auto from = static_cast<size_t>(byte_of[static_cast<size_t>(begin)]);
    const auto to = static_cast<size_t>(byte_of[static_cast<size_t>(end)]);
    out.push_back(text.substr(from, to - from));
  }
  ubrk_close(it);
  return out;
}

}  // namespace

Result<PrecompiledCharsmap> PrecompiledCharsmap::Parse(std::string_view blob) {
  PrecompiledCharsmap map;
  if (blob.empty()) return map;
  uint32_t trie_bytes = 0;
  if (blob.size() < 4) return Status::InvalidArgument("precompiled_charsmap: truncated");
  std::memcpy(&trie_bytes, blob.data(), 4);
  if (trie_bytes % 4 != 0 || trie_bytes == 0 || trie_bytes > blob.size() - 4) {
    return Status::InvalidArgument(
        fmt::format("precompiled_charsmap: a trie of {} bytes in {}", trie_bytes, blob.size()));
  }
  map.units_.resize(trie_bytes / 4);
  std::memcpy(map.units_.data(), blob.data() + 4, trie_bytes);
  map.replacements_ = std::string(blob.substr(4 + trie_bytes));
  return map;
}

const char* PrecompiledCharsmap::Transform(std::string_view chunk) const {
  if (units_.empty()) return nullptr;
  size_t node = Offset(units_[0]);
  for (const char c : chunk) {
    const auto byte = static_cast<unsigned char>(c);
    node ^= byte;
    if (node >= units_.size()) return nullptr;
    const uint32_t unit = units_[node];
    if (Label(unit) != byte) return nullptr;
    node ^= Offset(unit);
    if (node >= units_.size()) return nullptr;
    if (HasLeaf(unit)) {
      const uint32_t value = Value(units_[node]);
      return value < replacements_.size() ? replacements_.c_str() + value : nullptr;
    }
  }
  return nullptr;
}

std::string PrecompiledCharsmap::Normalize(std::string_view text) const {
  if (units_.empty()) return std::string(text);
  std::string out;
  out.reserve(text.size());
  for (const std::string_view grapheme : Graphemes(text)) {
    if (grapheme.size() < 6) {
      if (const char* replacement = Transform(grapheme)) {
        out += replacement;
        continue;
      }
    }
    for (size_t i = 0; i < grapheme.size();) {
      const auto n = static_cast<size_t>(Utf8Length(static_cast<unsigned char>(grapheme[i])));
      const std::string_view character = grapheme.substr(i, n);
      if (const char* replacement = Transform(character)) {
        out += replacement;
      } else {
        out += character;
      }
      i += n;
    }
  }
  return out;
}

Unigram::Unigram(std::vector<UnigramPiece> pieces, int32_t unknown, PrecompiledCharsmap charsmap,
                 bool fuse_unknown, bool byte_fallback)
    : pieces_(std::move(pieces)),
      unknown_(unknown),
      charsmap_(std::move(charsmap)),
      fuse_unknown_(fuse_unknown),
      byte_fallback_(byte_fallback) {
  double lowest = std::numeric_limits<double>::infinity();
  for (size_t id = 0; id < pieces_.size(); ++id) {
    const UnigramPiece& piece = pieces_[id];
    if (piece.text.empty()) continue;  // A placeholder: never matched.
    ids_.emplace(piece.text, static_cast<int32_t>(id));
    longest_ = std::max(longest_, piece.text.size());
    lowest = std::min(lowest, piece.score);
    unsigned value = 0;
    if (piece.text.size() == 6 && piece.text.starts_with("<0x") && piece.text[5] == '>' &&
        std::sscanf(piece.text.c_str() + 3, "%2x", &value) == 1) {
      byte_ids_[value] = static_cast<int32_t>(id);
    }
  }
  unknown_score_ = lowest - 10.0;
}

void Unigram::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  struct Node {
    int32_t id = -1;
    double score = 0;
    std::optional<size_t> start;
  };
  const size_t size = word.size();
  std::vector<Node> best(size + 1);
  best[0].start = 0;  // Reached, with score 0.
  std::string key;
  for (size_t start = 0; start < size;) {
    const double here = best[start].score;
    const auto length = static_cast<size_t>(Utf8Length(static_cast<unsigned char>(word[start])));
    bool single = false;
    // Every piece the text from `start` begins with, shortest first.
    const size_t limit = std::min(longest_, size - start);
    for (size_t n = 1; n <= limit; ++n) {
      key.assign(word, start, n);
      auto it = ids_.find(key);
      if (it == ids_.end()) continue;
      Node& target = best[start + n];
      const double candidate = pieces_[static_cast<size_t>(it->second)].score + here;
      if (!target.start || candidate > target.score) {
        target = {it->second, candidate, start};
      }
      single = single || n == length;
    }
    if (!single) {
      Node& target = best[std::min(size, start + length)];
      const double candidate = unknown_score_ + here;
      if (!target.start || candidate > target.score) target = {unknown_, candidate, start};
    }
    start += length;
  }
  // Back from the end; consecutive unknown pieces become one (fuse_unk).
  std::vector<std::pair<std::string_view, int32_t>> tokens;
  for (size_t end = size; end > 0;) {
    const Node& node = best[end];
    const size_t start = node.start.value_or(0);
    const std::string_view text = word.substr(start, end - start);
    if (fuse_unknown_ && node.id == unknown_ && !tokens.empty() &&
        tokens.back().second == unknown_ &&
        tokens.back().first.data() == text.data() + text.size()) {
      tokens.back().first = word.substr(start, tokens.back().first.size() + text.size());
    } else {
      tokens.emplace_back(text, node.id);
    }
    end = start;
  }
  for (auto it = tokens.rbegin(); it != tokens.rend(); ++it) {
    const auto& [text, id] = *it;
    if (id != unknown_) {
      ids.push_back(id);
      continue;
    }
    // An unknown piece by its text (the package looks tokens up by their strings).
    if (auto found = ids_.find(std::string(text)); found != ids_.end()) {
      ids.push_back(found->second);
      continue;
    }
    if (byte_fallback_) {
      std::vector<int32_t> bytes;
      for (const char c : text) bytes.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      if (std::find(bytes.begin(), bytes.end(), -1) == bytes.end()) {
        ids.insert(ids.end(), bytes.begin(), bytes.end());
        continue;
      }
    }
    ids.push_back(unknown_);
  }
}

void Unigram::Encode(std::string_view text, std::vector<int32_t>& ids) const {
  const std::string normalized = charsmap_.Normalize(text);
  // WhitespaceSplit, then Metaspace: "▁" before each word, a word split again before each "▁".
  const auto* bytes = reinterpret_cast<const uint8_t*>(normalized.data());
  const auto length = static_cast<int32_t>(normalized.size());
  std::string word;
  auto finish = [&] {
    if (word.empty()) return;
    const std::string prefixed = word.starts_with(kSpace) ? word : kSpace + word;
    size_t begin = 0;
    while (begin < prefixed.size()) {
      size_t next = prefixed.find(kSpace, begin + 3);
      if (next == std::string::npos) next = prefixed.size();
      EncodeWord(std::string_view(prefixed).substr(begin, next - begin), ids);
      begin = next;
    }
    word.clear();
  };
  for (int32_t i = 0; i < length;) {
    const int32_t start = i;
    UChar32 cp = 0;
    U8_NEXT(bytes, i, length, cp);
    if (cp >= 0 && u_isUWhiteSpace(cp)) {
      finish();
    } else {
      word.append(normalized, static_cast<size_t>(start), static_cast<size_t>(i - start));
    }
  }
  finish();
}

}  // namespace sluice::llm
