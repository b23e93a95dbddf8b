// The encoders' vocabularies (Tokenizer::Impl's loaders of them): WordPiece (BERT's) and
// SentencePiece Unigram (XLM-RoBERTa's), from tokenizer.json, GGUF files and SentencePiece's own
// model file.
#include <fmt/format.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>

#include "codec/base64.h"
#include "llm/files/gguf.h"
#include "llm/text/tokenizer_impl.h"
#include "sentencepiece_model.pb.h"

namespace sluice::llm {

// A SentencePiece piece's text when decoded: "▁" is a space.
std::string MetaspaceBytes(const std::string& piece) {
  std::string bytes;
  for (size_t i = 0; i < piece.size();) {
    if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
      bytes += ' ';
      i += 3;
    } else {
      bytes += piece[i++];
    }
  }
  return bytes;
}

// A WordPiece token's text when decoded: a "##" continuation glued to the piece before it, any
// other piece a word after a space (the decoder drops the text's first).
std::string WordPieceBytes(const std::string& token) {
  return token.starts_with("##") ? token.substr(2) : " " + token;
}

namespace {

// A word split off and "▁" put before it: the only pre-tokenizer read with a Unigram model.
bool IsWhitespaceSplitMetaspace(simdjson::dom::element pre) {
  std::string_view type;
  simdjson::dom::array steps;
  if (pre["type"].get(type) != simdjson::SUCCESS || type != "Sequence" ||
      pre["pretokenizers"].get(steps) != simdjson::SUCCESS || steps.size() != 2) {
    return false;
  }
  std::string_view first, second, replacement, prepend = "always";
  bool split = true;
  if (steps.at(0)["type"].get(first) != simdjson::SUCCESS || first != "WhitespaceSplit" ||
      steps.at(1)["type"].get(second) != simdjson::SUCCESS || second != "Metaspace") {
    return false;
  }
  ReadOptional(steps.at(1)["replacement"], replacement);
  ReadOptional(steps.at(1)["prepend_scheme"], prepend);
  ReadOptional(steps.at(1)["split"], split);
  return replacement == "\xE2\x96\x81" && prepend == "always" && split;
}

}  // namespace

Status Tokenizer::Impl::LoadUnigram(simdjson::dom::element root, const std::string& path) {
  simdjson::dom::element model = root["model"];
  simdjson::dom::array list;
  if (model["vocab"].get(list) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: Unigram without a vocab list", path));
  }
  std::vector<UnigramPiece> pieces;
  for (auto item : list) {
    std::string_view text;
    double score = 0;
    if (item.at(0).get(text) != simdjson::SUCCESS || item.at(1).get(score) != simdjson::SUCCESS) {
      return Status::InvalidArgument(fmt::format("{}: bad Unigram piece", path));
    }
    pieces.push_back({std::string(text), score});
  }
  int64_t unknown = -1;
  ReadOptional(model["unk_id"], unknown);
  if (unknown < 0 || unknown >= static_cast<int64_t>(pieces.size())) {
    return Status::InvalidArgument(fmt::format("{}: Unigram without a valid unk_id", path));
  }
  bool fallback = false;
  ReadOptional(model["byte_fallback"], fallback);
  // Normalizer: Precompiled (SentencePiece's map), alone or before collapsing runs of spaces
  // (which the whitespace split makes moot); none.
  PrecompiledCharsmap charsmap;
  simdjson::dom::element normalizer;
  if (root["normalizer"].get(normalizer) == simdjson::SUCCESS && !normalizer.is_null()) {
    std::vector<simdjson::dom::element> parts;
    std::string_view type;
    ReadOptional(normalizer["type"], type);
    if (type == "Sequence") {
      for (auto part : normalizer["normalizers"].get_array()) parts.push_back(part);
    } else {
      parts.push_back(normalizer);
    }
    for (simdjson::dom::element part : parts) {
      std::string_view kind, map, pattern, content;
      ReadOptional(part["type"], kind);
      if (kind == "Precompiled" && part["precompiled_charsmap"].get(map) == simdjson::SUCCESS) {
        auto blob = Base64Decode(map);
        if (!blob.ok()) {
          return Status::InvalidArgument(
              fmt::format("{}: precompiled_charsmap is not base64", path));
        }
        auto parsed = PrecompiledCharsmap::Parse(*blob);
        if (!parsed.ok()) {
          return Status::InvalidArgument(fmt::format("{}: {}", path, parsed.status().message()));
        }
        charsmap = std::move(*parsed);
      } else if (kind == "Replace" && part["pattern"]["Regex"].get(pattern) == simdjson::SUCCESS &&
                 pattern == " {2,}" && part["content"].get(content) == simdjson::SUCCESS &&
                 content == " ") {
        continue;
      } else {
        return Status::InvalidArgument(fmt::format(
            "{}: a Unigram tokenizer with the normalizer '{}' is not supported (Sluice reads "
            "Precompiled)",
            path, kind));
      }
    }
  }
  simdjson::dom::element pre;
  if (root["pre_tokenizer"].get(pre) != simdjson::SUCCESS || !IsWhitespaceSplitMetaspace(pre)) {
    return Status::InvalidArgument(fmt::format(
        "{}: a Unigram tokenizer's pre-tokenizer must be WhitespaceSplit then Metaspace (\"▁\" "
        "before every word), as XLM-RoBERTa's and T5's are",
        path));
  }
  std::vector<std::pair<AddedToken, bool>> added_tokens;
  simdjson::dom::array added_json;
  if (root["added_tokens"].get(added_json) == simdjson::SUCCESS) {
    for (auto item : added_json) {
      int64_t id = 0;
      std::string_view content;
      bool is_special = false;
      if (item["id"].get(id) != simdjson::SUCCESS ||
          item["content"].get(content) != simdjson::SUCCESS || id < 0 || id > (1 << 24)) {
        return Status::InvalidArgument(fmt::format("{}: bad added token", path));
      }
      ReadOptional(item["special"], is_special);
      AddedToken token{std::string(content), static_cast<int32_t>(id)};
      ReadOptional(item["lstrip"], token.lstrip);
      ReadOptional(item["rstrip"], token.rstrip);
      added_tokens.emplace_back(std::move(token), is_special);
    }
  }
  SetUnigram(std::move(pieces), static_cast<int32_t>(unknown), std::move(charsmap), fallback,
             std::move(added_tokens));
  return LoadPostProcessor(root["post_processor"], path);
}

void Tokenizer::Impl::SetUnigram(std::vector<UnigramPiece> pieces, int32_t unknown,
                                 PrecompiledCharsmap charsmap, bool byte_fallback,
                                 std::vector<std::pair<AddedToken, bool>> added_tokens) {
  id_bytes.assign(pieces.size(), "");
  special.assign(pieces.size(), false);
  for (size_t id = 0; id < pieces.size(); ++id) {
    vocab.emplace(pieces[id].text, static_cast<int32_t>(id));
    id_bytes[id] = MetaspaceBytes(pieces[id].text);
  }
  for (auto& [token, is_special] : added_tokens) {
    const auto id = static_cast<size_t>(token.id);
    if (id >= id_bytes.size()) {
      id_bytes.resize(id + 1);
      special.resize(id + 1);
    }
    id_bytes[id] = token.text;
    special[id] = is_special;
    vocab[token.text] = token.id;
    added.push_back(std::move(token));
  }
  Finish();
  strip_decoded_space = true;
  unigram = std::make_unique<Unigram>(std::move(pieces), unknown, std::move(charsmap),
                                      /*fuse_unknown=*/true, byte_fallback);
}

// transformers' XLM-RoBERTa conversion (XLMRobertaConverter): the file's first three pieces
// (<unk>, <s>, </s>) give way to <s> <pad> </s> <unk> (fairseq's order: every other piece one id
// later), <mask> after the last; the unknown is id 3, no byte fallback; the file's character map
// as the normalizer; WhitespaceSplit and Metaspace ("▁" before every word); <s> A </s> and
// <s> A </s></s> B </s> around the texts. The special tokens' strings are tokenizer_config.json's.
Status Tokenizer::Impl::LoadXlmRobertaSentencePiece(const sentencepiece::ModelProto& proto,
                                                    const HfTokenizerConfig& config,
                                                    const std::string& path) {
  if (!config.add_prefix_space) {
    return Status::InvalidArgument(fmt::format(
        "{}: add_prefix_space false is not supported (Sluice puts \"▁\" before every word)", path));
  }
  if (proto.pieces_size() < 3) {
    return Status::InvalidArgument(fmt::format("{}: fewer than three pieces", path));
  }
  auto named = [](const std::string& token, const char* fallback) {
    return token.empty() ? std::string(fallback) : token;
  };
  const std::string bos_token = named(config.bos, "<s>"), eos_token = named(config.eos, "</s>");
  const std::string specials[] = {bos_token, named(config.pad, "<pad>"), eos_token,
                                  named(config.unk, "<unk>")};
  std::vector<UnigramPiece> pieces;
  std::vector<std::pair<AddedToken, bool>> added_tokens;
  for (const std::string& token : specials) {
    added_tokens.emplace_back(AddedToken{token, static_cast<int32_t>(pieces.size())}, true);
    pieces.push_back({token, 0.0});
  }
  for (int i = 3; i < proto.pieces_size(); ++i) {
    const sentencepiece::ModelProto::SentencePiece& piece = proto.pieces(i);
    if (!IsValidUtf8(piece.piece())) {
      return Status::InvalidArgument(fmt::format("{}: piece {} is not UTF-8", path, i));
    }
    // The file's control and user-defined pieces are matched in text as themselves.
    if (piece.type() == sentencepiece::ModelProto::SentencePiece::CONTROL ||
        piece.type() == sentencepiece::ModelProto::SentencePiece::USER_DEFINED) {
      added_tokens.emplace_back(AddedToken{piece.piece(), static_cast<int32_t>(pieces.size())},
                                piece.type() == sentencepiece::ModelProto::SentencePiece::CONTROL);
    }
    pieces.push_back({piece.piece(), piece.score()});
  }
  const std::string mask_token = named(config.mask, "<mask>");
  added_tokens.emplace_back(AddedToken{mask_token, static_cast<int32_t>(pieces.size())}, true);
  pieces.push_back({mask_token, 0.0});
  // tokenizer_config.json's added_tokens_decoder: a token of the vocabulary keeps its id.
  for (const auto& entry : config.added) {
    const AddedToken& token = entry.first;  // Named: lambdas capture no structured binding.
    const bool is_special = entry.second;
    auto known = std::find_if(pieces.begin(), pieces.end(),
                              [&](const UnigramPiece& p) { return p.text == token.text; });
    AddedToken listed = token;
    if (known != pieces.end()) {
      listed.id = static_cast<int32_t>(known - pieces.begin());
      auto already = std::find_if(added_tokens.begin(), added_tokens.end(),
                                  [&](const auto& a) { return a.first.id == listed.id; });
      if (already != added_tokens.end()) {  // The config's attributes (<mask>'s lstrip).
        already->first = std::move(listed);
        already->second = is_special;
        continue;
      }
    } else if (static_cast<size_t>(token.id) < pieces.size()) {
      return Status::InvalidArgument(fmt::format(
          "{}/tokenizer_config.json: added token '{}' has id {}, which is the piece '{}'",
          std::filesystem::path(path).parent_path().string(), token.text, token.id,
          pieces[static_cast<size_t>(token.id)].text));
    }
    added_tokens.emplace_back(std::move(listed), is_special);
  }
  PrecompiledCharsmap charsmap;
  if (!proto.normalizer_spec().precompiled_charsmap().empty()) {
    auto parsed = PrecompiledCharsmap::Parse(proto.normalizer_spec().precompiled_charsmap());
    if (!parsed.ok()) {
      return Status::InvalidArgument(fmt::format("{}: {}", path, parsed.status().message()));
    }
    charsmap = std::move(*parsed);
  }
  SetUnigram(std::move(pieces), /*unknown=*/3, std::move(charsmap), /*byte_fallback=*/false,
             std::move(added_tokens));
  const int32_t bos_id = 0, eos_id = 2;
  prefix = {bos_id};
  suffix = {eos_id};
  pair_template = {{bos_id}, {eos_id, eos_id}, {eos_id}};
  bos = bos_token;
  eos = eos_token;
  chat_template = config.chat_template;
  return Status::Ok();
}

Status Tokenizer::Impl::LoadWordPiece(simdjson::dom::element root,
                                      std::unordered_map<std::string, int32_t> model_vocab,
                                      const std::string& path) {
  simdjson::dom::element model = root["model"];
  WordPieceOptions options;
  std::string_view text;
  if (model["continuing_subword_prefix"].get(text) == simdjson::SUCCESS) {
    options.continuing_prefix = std::string(text);
  }
  int64_t max_chars = options.max_input_chars_per_word;
  ReadOptional(model["max_input_chars_per_word"], max_chars);
  options.max_input_chars_per_word = static_cast<int>(std::min<int64_t>(max_chars, 1 << 20));
  std::string_view unknown_token;
  if (model["unk_token"].get(unknown_token) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: WordPiece without unk_token", path));
  }
  auto unknown = model_vocab.find(std::string(unknown_token));
  if (unknown == model_vocab.end()) {
    return Status::InvalidArgument(
        fmt::format("{}: unk_token '{}' is not in the vocab", path, unknown_token));
  }
  const int32_t unknown_id = unknown->second;
  // The normalizer: BertNormalizer, or none. Others would change the text in ways not done here.
  simdjson::dom::element normalizer;
  if (root["normalizer"].get(normalizer) == simdjson::SUCCESS && !normalizer.is_null()) {
    std::string_view type;
    ReadOptional(normalizer["type"], type);
    if (type != "BertNormalizer") {
      return Status::InvalidArgument(fmt::format(
          "{}: WordPiece with the normalizer '{}' is not supported (Sluice reads BertNormalizer)",
          path, type));
    }
    ReadOptional(normalizer["clean_text"], options.clean_text);
    ReadOptional(normalizer["handle_chinese_chars"], options.handle_chinese_chars);
    ReadOptional(normalizer["lowercase"], options.lowercase);
    options.strip_accents = options.lowercase;
    ReadOptional(normalizer["strip_accents"], options.strip_accents);  // null: as lowercase.
  } else {
    options = WordPieceOptions{
        false, false, false, false, options.continuing_prefix, options.max_input_chars_per_word};
  }
  std::string_view pre_type;
  ReadOptional(root["pre_tokenizer"]["type"], pre_type);
  if (pre_type != "BertPreTokenizer") {
    return Status::InvalidArgument(
        fmt::format("{}: WordPiece with the pre-tokenizer '{}' is not supported (Sluice reads "
                    "BertPreTokenizer)",
                    path, pre_type));
  }
  wordpiece = std::make_unique<WordPiece>(std::move(options), std::move(model_vocab), unknown_id);
  return Status::Ok();
}

Status Tokenizer::Impl::LoadGgufUnigram(const GgufFile& file,
                                        const std::vector<std::string>& tokens,
                                        const std::vector<int64_t>& types) {
  const std::string& path = file.path();
  const size_t count = tokens.size();
  auto scores = file.Numbers("tokenizer.ggml.scores");
  if (!scores.ok()) return scores.status();
  if ((*scores)->size() != count) {
    return Status::InvalidArgument(
        fmt::format("{}: {} token scores for {} tokens", path, (*scores)->size(), count));
  }
  PrecompiledCharsmap charsmap;
  if (file.Find("tokenizer.ggml.precompiled_charsmap") != nullptr) {
    auto bytes = file.Integers("tokenizer.ggml.precompiled_charsmap");
    if (!bytes.ok()) return bytes.status();
    std::string blob;
    for (const int64_t b : **bytes) blob.push_back(static_cast<char>(b));
    auto parsed = PrecompiledCharsmap::Parse(blob);
    if (!parsed.ok()) {
      return Status::InvalidArgument(fmt::format("{}: {}", path, parsed.status().message()));
    }
    charsmap = std::move(*parsed);
  }
  auto unknown = file.Integer("tokenizer.ggml.unknown_token_id", -1);
  if (!unknown.ok()) return unknown.status();
  if (*unknown < 0 || *unknown >= static_cast<int64_t>(count)) {
    return Status::InvalidArgument(
        fmt::format("{}: a Unigram vocabulary needs tokenizer.ggml.unknown_token_id", path));
  }
  std::vector<UnigramPiece> pieces(count);
  id_bytes.assign(count, "");
  special.assign(count, false);
  for (size_t id = 0; id < count; ++id) {
    const std::string& token = tokens[id];
    const auto index = static_cast<int32_t>(id);
    vocab.emplace(token, index);
    id_bytes[id] = MetaspaceBytes(token);
    if (types[id] == kGgufControl || types[id] == kGgufUserDefined || types[id] == kGgufUnknown) {
      // Matched in text as themselves (the tokenizers package's added tokens).
      id_bytes[id] = token;
      special[id] = types[id] != kGgufUserDefined;
      added.push_back({token, index});
    }
    // The converter's fillers (unused) are no pieces: they would lower the unknown's score.
    if (types[id] != kGgufUnused) pieces[id] = {token, (**scores)[id]};
  }
  strip_decoded_space = true;
  unigram = std::make_unique<Unigram>(std::move(pieces), static_cast<int32_t>(*unknown),
                                      std::move(charsmap), /*fuse_unknown=*/true,
                                      /*byte_fallback=*/false);
  return Status::Ok();
}

Status Tokenizer::Impl::LoadGgufWordPiece(const GgufFile& file,
                                          const std::vector<std::string>& tokens,
                                          const std::vector<int64_t>& types) {
  const std::string& path = file.path();
  const size_t count = tokens.size();
  WordPieceOptions options;
  auto lowercase = file.Bool("tokenizer.ggml.normalizer.lowercase", false);
  if (!lowercase.ok()) return lowercase.status();
  options.lowercase = *lowercase;
  auto strip_accents = file.Bool("tokenizer.ggml.normalizer.strip_accents", *lowercase);
  if (!strip_accents.ok()) return strip_accents.status();
  options.strip_accents = *strip_accents;
  id_bytes.assign(count, "");
  special.assign(count, false);
  std::unordered_map<std::string, int32_t> model_vocab;
  for (size_t id = 0; id < count; ++id) {
    const std::string& token = tokens[id];
    const auto index = static_cast<int32_t>(id);
    if (types[id] == kGgufControl || types[id] == kGgufUserDefined) {
      vocab.emplace(token, index);
      id_bytes[id] = token;
      special[id] = types[id] == kGgufControl;
      added.push_back({token, index});
      continue;
    }
    // Back to BERT's own spelling: "▁word" starts a word, a bare piece continues one.
    std::string piece =
        token.starts_with("\xE2\x96\x81") ? token.substr(3) : options.continuing_prefix + token;
    id_bytes[id] = WordPieceBytes(piece);
    vocab.emplace(piece, index);
    model_vocab.emplace(std::move(piece), index);
  }
  auto unknown = file.Integer("tokenizer.ggml.unknown_token_id", -1);
  if (!unknown.ok()) return unknown.status();
  if (*unknown < 0 || *unknown >= static_cast<int64_t>(count)) {
    return Status::InvalidArgument(
        fmt::format("{}: a WordPiece vocabulary needs tokenizer.ggml.unknown_token_id", path));
  }
  strip_decoded_space = true;
  wordpiece = std::make_unique<WordPiece>(std::move(options), std::move(model_vocab),
                                          static_cast<int32_t>(*unknown));
  return Status::Ok();
}

}  // namespace sluice::llm
