#include "llm/text/wordpiece.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/utf8.h>

#include <utility>

namespace sluice::llm {

namespace {

std::vector<UChar32> CodePoints(std::string_view text) {
  std::vector<UChar32> cps;
  cps.reserve(text.size());
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const auto length = static_cast<int32_t>(text.size());
  for (int32_t i = 0; i < length;) {
    UChar32 cp = 0;
    U8_NEXT(bytes, i, length, cp);
    cps.push_back(cp < 0 ? 0xFFFD : cp);
  }
  return cps;
}

void AppendUtf8(UChar32 cp, std::string& out) {
  uint8_t buffer[U8_MAX_LENGTH];
  int32_t length = 0;
  UBool error = false;
  U8_APPEND(buffer, length, U8_MAX_LENGTH, cp, error);
  if (!error) out.append(reinterpret_cast<const char*>(buffer), static_cast<size_t>(length));
}

// The tokenizers package's definitions (normalizers/bert.rs, pre_tokenizers/bert.rs). Its
// general categories (control, punctuation, non-spacing mark) come from Unicode 8.0's tables,
// its whitespace, lowercasing and NFD from Rust's and a current Unicode: a character assigned
// after 8.0 is in no category there (measured: U+2E42, 8.0, is punctuation to it; U+2E43, 9.0,
// is not), so here too.
uint32_t Category(UChar32 cp) {
  UVersionInfo age;
  u_charAge(cp, age);
  if (age[0] > 8 || (age[0] == 8 && age[1] > 0)) return U_GC_CN_MASK;
  return U_GET_GC_MASK(cp);
}

bool IsWhitespace(UChar32 cp) {
  return cp == '\t' || cp == '\n' || cp == '\r' || u_isUWhiteSpace(cp);
}

bool IsControl(UChar32 cp) {
  if (cp == '\t' || cp == '\n' || cp == '\r') return false;
  // Cc, Cf, Cs and Co; unassigned code points (Cn) are kept, as the package keeps them.
  return (Category(cp) & (U_GC_CC_MASK | U_GC_CF_MASK | U_GC_CS_MASK | U_GC_CO_MASK)) != 0;
}

bool IsChinese(UChar32 cp) {
  return (cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
         (cp >= 0x20000 && cp <= 0x2A6DF) || (cp >= 0x2A700 && cp <= 0x2B73F) ||
         (cp >= 0x2B740 && cp <= 0x2B81F) || (cp >= 0x2B920 && cp <= 0x2CEAF) ||
         (cp >= 0xF900 && cp <= 0xFAFF) || (cp >= 0x2F800 && cp <= 0x2FA1F);
}

bool IsPunctuation(UChar32 cp) {
  if (cp < 0x80) {
    return (cp >= 33 && cp <= 47) || (cp >= 58 && cp <= 64) || (cp >= 91 && cp <= 96) ||
           (cp >= 123 && cp <= 126);
  }
  return (Category(cp) & U_GC_P_MASK) != 0;
}

// Canonical decomposition (NFD) of `cps`.
std::vector<UChar32> Nfd(const std::vector<UChar32>& cps) {
  std::u16string utf16;
  utf16.reserve(cps.size());
  for (const UChar32 cp : cps) {
    if (U_IS_BMP(cp)) {
      utf16.push_back(static_cast<char16_t>(cp));
    } else {
      utf16.push_back(static_cast<char16_t>(U16_LEAD(cp)));
      utf16.push_back(static_cast<char16_t>(U16_TRAIL(cp)));
    }
  }
  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* nfd = unorm2_getNFDInstance(&status);
  if (U_FAILURE(status)) return cps;
  std::u16string out(utf16.size() * 3 + 4, u'\0');
  int32_t length = unorm2_normalize(nfd, utf16.data(), static_cast<int32_t>(utf16.size()),
                                    out.data(), static_cast<int32_t>(out.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    out.assign(static_cast<size_t>(length), u'\0');
    length = unorm2_normalize(nfd, utf16.data(), static_cast<int32_t>(utf16.size()), out.data(),
                              length, &status);
  }
  if (U_FAILURE(status)) return cps;
  std::vector<UChar32> result;
  result.reserve(static_cast<size_t>(length));
  for (int32_t i = 0; i < length;) {
    UChar32 cp = 0;
    U16_NEXT(out.data(), i, length, cp);
    result.push_back(cp);
  }
  return result;
}

// A character's full lowercase mapping, without context (as Rust's char::to_lowercase: a final
// sigma is σ, not ς).
void AppendLowercase(UChar32 cp, std::vector<UChar32>& out) {
  if (cp < 0x80) {
    out.push_back(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
    return;
  }
  if (!u_hasBinaryProperty(cp, UCHAR_CHANGES_WHEN_LOWERCASED)) {
    out.push_back(cp);
    return;
  }
  UChar source[2];
  int32_t source_length = 0;
  U16_APPEND_UNSAFE(source, source_length, cp);
  UChar lower[8];
  UErrorCode status = U_ZERO_ERROR;
  const int32_t length = u_strToLower(lower, 8, source, source_length, "", &status);
  if (U_FAILURE(status)) {
    out.push_back(u_tolower(cp));
    return;
  }
  for (int32_t i = 0; i < length;) {
    UChar32 c = 0;
    U16_NEXT(lower, i, length, c);
    out.push_back(c);
  }
}

}  // namespace

WordPiece::WordPiece(WordPieceOptions options, std::unordered_map<std::string, int32_t> vocab,
                     int32_t unknown)
    : options_(std::move(options)), vocab_(std::move(vocab)), unknown_(unknown) {}

std::vector<std::string> WordPiece::Words(std::string_view text) const {
  // BertNormalizer: clean, CJK, accents, lowercase, in that order.
  std::vector<UChar32> cps;
  for (const UChar32 cp : CodePoints(text)) {
    if (options_.clean_text) {
      if (cp == 0 || cp == 0xFFFD || IsControl(cp)) continue;
      if (IsWhitespace(cp)) {
        cps.push_back(' ');
        continue;
      }
    }
    if (options_.handle_chinese_chars && IsChinese(cp)) {
      cps.push_back(' ');
      cps.push_back(cp);
      cps.push_back(' ');
    } else {
      cps.push_back(cp);
    }
  }
  if (options_.strip_accents) {
    std::vector<UChar32> kept;
    for (const UChar32 cp : Nfd(cps)) {
      if (Category(cp) != U_GC_MN_MASK) kept.push_back(cp);
    }
    cps = std::move(kept);
  }
  if (options_.lowercase) {
    std::vector<UChar32> lower;
    lower.reserve(cps.size());
    for (const UChar32 cp : cps) AppendLowercase(cp, lower);
    cps = std::move(lower);
  }
  // BertPreTokenizer: whitespace splits and goes; punctuation is a word of its own.
  std::vector<std::string> words;
  std::string word;
  auto finish = [&] {
    if (!word.empty()) words.push_back(std::move(word));
    word.clear();
  };
  for (const UChar32 cp : cps) {
    if (IsWhitespace(cp)) {
      finish();
    } else if (IsPunctuation(cp)) {
      finish();
      AppendUtf8(cp, word);
      finish();
    } else {
      AppendUtf8(cp, word);
    }
  }
  finish();
  return words;
}

void WordPiece::Encode(std::string_view text, std::vector<int32_t>& ids) const {
  for (const std::string& word : Words(text)) {
    size_t chars = 0;
    for (const char c : word) chars += (static_cast<uint8_t>(c) & 0xC0) != 0x80;
    EncodeWord(word, chars, ids);
  }
}

void WordPiece::EncodeWord(const std::string& word, size_t chars, std::vector<int32_t>& ids) const {
  if (chars > static_cast<size_t>(options_.max_input_chars_per_word)) {
    ids.push_back(unknown_);
    return;
  }
  const size_t first = ids.size();
  std::string piece;
  for (size_t start = 0; start < word.size();) {
    // The longest piece from `start` in the vocabulary, shortened a character at a time.
    size_t end = word.size();
    int32_t found = -1;
    while (end > start) {
      piece.clear();
      if (start > 0) piece = options_.continuing_prefix;
      piece.append(word, start, end - start);
      if (auto it = vocab_.find(piece); it != vocab_.end()) {
        found = it->second;
        break;
      }
      do {
        --end;
      } while (end > start && (static_cast<uint8_t>(word[end]) & 0xC0) == 0x80);
    }
    if (found < 0) {  // The word does not split into pieces: it is unknown as a whole.
      ids.resize(first);
      ids.push_back(unknown_);
      return;
    }
    ids.push_back(found);
    start = end;
  }
}

}  // namespace sluice::llm
