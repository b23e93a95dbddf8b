#include "llm/text/tokenizer.h"

#include "llm/files/gguf.h"
#include "llm/text/tokenizer_impl.h"
#include "sentencepiece_model.pb.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>
#include <simdjson.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <queue>
#include <sstream>
#include <unordered_map>

namespace sluice::llm {

// A compiled pre-tokenizer pattern.
struct Regex {
  pcre2_code* code = nullptr;
  ~Regex() {
    if (code) pcre2_code_free(code);
  }
};

// GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest shift to 256+.
std::vector<uint32_t> ByteToCodePoint() {
  std::vector<uint32_t> table(256);
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
    table[b] = printable ? b : next++;
  }
  return table;
}

namespace {

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length of the valid UTF-8 sequence at `s` (1-4), 0 if invalid, -1 if truncated at the end.
int SequenceLength(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  if (b0 < 0x80) return 1;
  int len = 0;
  uint32_t min = 0;
  if ((b0 & 0xE0) == 0xC0) {
    len = 2, min = 0x80;
  } else if ((b0 & 0xF0) == 0xE0) {
    len = 3, min = 0x800;
  } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
    len = 4, min = 0x10000;
  } else {
    return 0;
  }
  uint32_t cp = b0 & (0x7F >> len);
  for (int i = 1; i < len; ++i) {
    if (static_cast<size_t>(i) >= s.size()) return -1;
    const auto b = static_cast<unsigned char>(s[static_cast<size_t>(i)]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
    // Reject overlong and surrogate prefixes as early as the second byte allows.
    if (i == 1 && ((len == 3 && b0 == 0xE0 && b < 0xA0) || (len == 3 && b0 == 0xED && b >= 0xA0) ||
                   (len == 4 && b0 == 0xF0 && b < 0x90) || (len == 4 && b0 == 0xF4 && b >= 0x90))) {
      return 0;
    }
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

Result<std::shared_ptr<Regex>> CompileRegex(const std::string& pattern) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  auto regex = std::make_shared<Regex>();
  regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (regex->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Status::InvalidArgument(fmt::format("tokenizer regex '{}' does not compile at {}: {}",
                                               pattern, offset, reinterpret_cast<char*>(message)));
  }
  pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);  // Falls back to the interpreter.
  return regex;
}

// GPT-2's split, as the ByteLevel pre-tokenizer of the tokenizers package uses it.
constexpr const char* kByteLevelPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace

Status Tokenizer::Impl::LoadPreTokenizer(simdjson::dom::element spec) {
  if (spec.is_null()) return Status::Ok();
  std::string_view type;
  if (spec["type"].get(type) != simdjson::SUCCESS) {
    return Status::InvalidArgument("tokenizer.json: pre_tokenizer has no type");
  }
  if (type == "Sequence") {
    simdjson::dom::array items;
    if (spec["pretokenizers"].get(items) != simdjson::SUCCESS) {
      return Status::InvalidArgument("tokenizer.json: Sequence without pretokenizers");
    }
    for (auto item : items) SLUICE_RETURN_IF_ERROR(LoadPreTokenizer(item));
    return Status::Ok();
  }
  PreTokenizerStep step;
  std::string pattern;
  if (type == "ByteLevel") {
    bool use_regex = true, prefix_space = false;
    ReadOptional(spec["use_regex"], use_regex);
    ReadOptional(spec["add_prefix_space"], prefix_space);
    if (!use_regex && !prefix_space) return Status::Ok();
    step.add_prefix_space = prefix_space;
    pattern = use_regex ? kByteLevelPattern : "";
  } else if (type == "Digits") {
    bool individual = false;
    ReadOptional(spec["individual_digits"], individual);
    pattern = individual ? R"(\p{N})" : R"(\p{N}+)";
  } else if (type == "Split") {
    std::string_view regex, behavior;
    bool invert = false;
    ReadOptional(spec["invert"], invert);
    if (spec["pattern"]["Regex"].get(regex) != simdjson::SUCCESS &&
        spec["pattern"]["String"].get(regex) != simdjson::SUCCESS) {
      return Status::InvalidArgument("tokenizer.json: Split without a pattern");
    }
    if (spec["pattern"]["String"].get(regex) == simdjson::SUCCESS) {
      std::string quoted = "\\Q" + std::string(regex) + "\\E";
      pattern = quoted;
    } else {
      pattern = std::string(regex);
    }
    ReadOptional(spec["behavior"], behavior);
    if (invert || (behavior != "Isolated" && behavior != "Removed")) {
      return Status::InvalidArgument(
          fmt::format("tokenizer.json: Split behavior '{}'{} is not supported (Isolated, Removed)",
                      behavior, invert ? " inverted" : ""));
    }
    if (behavior == "Removed") step.kind = PreTokenizerStep::kRemove;
  } else {
    return Status::InvalidArgument(fmt::format(
        "tokenizer.json: pre-tokenizer '{}' is not supported (ByteLevel, Digits, Split, Sequence)",
        type));
  }
  if (!pattern.empty()) {
    auto regex = CompileRegex(pattern);
    if (!regex.ok()) return regex.status();
    step.regex = *regex;
  }
  steps.push_back(std::move(step));
  return Status::Ok();
}

Status Tokenizer::Impl::Load(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path path = fs::path(dir) / "tokenizer.json";
  std::error_code exists_error;
  if (!fs::exists(path, exists_error)) {
    // SentencePiece's own file: tokenizer.model, or XLM-RoBERTa's sentencepiece.bpe.model.
    for (const char* name : {"tokenizer.model", "sentencepiece.bpe.model"}) {
      const fs::path model_path = fs::path(dir) / name;
      if (fs::exists(model_path, exists_error)) {
        return LoadSentencePieceModel(dir, model_path.string());
      }
    }
  }
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  if (parser.load(path.string()).get(root) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: cannot read it as JSON", path.string()));
  }
  simdjson::dom::element model = root["model"];
  std::string_view type;
  if (model["type"].get(type) == simdjson::SUCCESS && type == "Unigram") {
    SLUICE_RETURN_IF_ERROR(LoadUnigram(root, path.string()));
    return LoadTokenizerConfig(dir);
  }
  if (model["type"].get(type) != simdjson::SUCCESS || (type != "BPE" && type != "WordPiece")) {
    return Status::InvalidArgument(fmt::format(
        "{}: model type '{}' is not supported (Sluice reads BPE, WordPiece and Unigram)",
        path.string(), type));
  }
  const bool is_wordpiece = type == "WordPiece";
  std::string_view affix;
  if (!is_wordpiece &&
      ((model["continuing_subword_prefix"].get(affix) == simdjson::SUCCESS && !affix.empty()) ||
       (model["end_of_word_suffix"].get(affix) == simdjson::SUCCESS && !affix.empty()))) {
    return Status::InvalidArgument(
        fmt::format("{}: subword prefixes and suffixes are not supported", path.string()));
  }
  if (!is_wordpiece) SLUICE_RETURN_IF_ERROR(LoadHfSentencePiece(root, path.string()));
  simdjson::dom::object vocab_json;
  if (model["vocab"].get(vocab_json) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: no vocab", path.string()));
  }
  int64_t max_id = -1;
  for (auto field : vocab_json) {
    int64_t id = 0;
    if (field.value.get(id) != simdjson::SUCCESS || id < 0 || id > (1 << 24)) {
      return Status::InvalidArgument(fmt::format("{}: bad vocab id", path.string()));
    }
    vocab.emplace(std::string(field.key), static_cast<int32_t>(id));
    max_id = std::max(max_id, id);
  }
  const std::unordered_map<std::string, int32_t> model_vocab =
      is_wordpiece ? vocab : std::unordered_map<std::string, int32_t>();
  simdjson::dom::array added_json;
  if (root["added_tokens"].get(added_json) == simdjson::SUCCESS) {
    for (auto item : added_json) {
      int64_t id = 0;
      std::string_view content;
      if (item["id"].get(id) != simdjson::SUCCESS ||
          item["content"].get(content) != simdjson::SUCCESS || id < 0 || id > (1 << 24)) {
        return Status::InvalidArgument(fmt::format("{}: bad added token", path.string()));
      }
      max_id = std::max(max_id, id);
      AddedToken token{std::string(content), static_cast<int32_t>(id)};
      ReadOptional(item["lstrip"], token.lstrip);
      ReadOptional(item["rstrip"], token.rstrip);
      added.push_back(std::move(token));
    }
  }
  id_bytes.assign(static_cast<size_t>(max_id + 1), "");
  special.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [token, id] : vocab) {
    std::string& bytes = id_bytes[static_cast<size_t>(id)];
    if (is_wordpiece) {
      bytes = WordPieceBytes(token);
    } else if (hf_sentencepiece) {
      // "▁" stands for a space; with byte_fallback <0xXX> for its byte.
      unsigned value = 0;
      if (byte_fallback && token.size() == 6 && token.starts_with("<0x") && token[5] == '>' &&
          std::sscanf(token.c_str() + 3, "%2x", &value) == 1) {
        bytes.assign(1, static_cast<char>(value));
        continue;
      }
      for (size_t i = 0; i < token.size();) {
        if (token.compare(i, 3, "\xE2\x96\x81") == 0) {
          bytes += ' ';
          i += 3;
        } else {
          bytes += token[i++];
        }
      }
    } else if (!ByteLevelBytes(token, &bytes)) {
      return Status::InvalidArgument(fmt::format("{}: vocab is not UTF-8", path.string()));
    }
  }
  for (auto item : added_json) {
    int64_t id = 0;
    std::string_view content;
    bool is_special = false;
    ReadOptional(item["id"], id);
    ReadOptional(item["content"], content);
    ReadOptional(item["special"], is_special);
    id_bytes[static_cast<size_t>(id)] = std::string(content);
    special[static_cast<size_t>(id)] = is_special;
    vocab[std::string(content)] = static_cast<int32_t>(id);
  }
  Finish();
  if (is_wordpiece) {
    strip_decoded_space = true;
    SLUICE_RETURN_IF_ERROR(LoadWordPiece(root, model_vocab, path.string()));
    SLUICE_RETURN_IF_ERROR(LoadPostProcessor(root["post_processor"], path.string()));
    return LoadTokenizerConfig(dir);
  }
  if (hf_sentencepiece) {
    std::string_view unknown;
    if (model["unk_token"].get(unknown) == simdjson::SUCCESS) {
      auto it = vocab.find(std::string(unknown));
      if (it == vocab.end()) {
        return Status::InvalidArgument(
            fmt::format("{}: unk_token '{}' is not in the vocab", path.string(), unknown));
      }
      unknown_id = it->second;
    }
    ReadOptional(model["fuse_unk"], fuse_unknown);
  }
  simdjson::dom::array merges_json;
  if (model["merges"].get(merges_json) != simdjson::SUCCESS) {
    return Status::InvalidArgument(fmt::format("{}: no merges", path.string()));
  }
  int32_t rank = 0;
  for (auto item : merges_json) {
    std::string left, right;
    std::string_view text;
    simdjson::dom::array pair;
    if (item.get(text) == simdjson::SUCCESS) {
      const size_t space = text.find(' ');
      if (space == std::string_view::npos)
        return Status::InvalidArgument("tokenizer.json: bad merge");
      left = std::string(text.substr(0, space));
      right = std::string(text.substr(space + 1));
    } else if (item.get(pair) == simdjson::SUCCESS && pair.size() == 2) {
      std::string_view a, b;
      if (pair.at(0).get(a) != simdjson::SUCCESS || pair.at(1).get(b) != simdjson::SUCCESS) {
        return Status::InvalidArgument("tokenizer.json: bad merge");
      }
      left = std::string(a);
      right = std::string(b);
    } else {
      return Status::InvalidArgument("tokenizer.json: bad merge");
    }
    SLUICE_RETURN_IF_ERROR(AddMerge(left, right, rank++, path.string()));
  }
  if (!metaspace) SLUICE_RETURN_IF_ERROR(LoadPreTokenizer(root["pre_tokenizer"]));
  SLUICE_RETURN_IF_ERROR(LoadPostProcessor(root["post_processor"], path.string()));
  return LoadTokenizerConfig(dir);
}

Status Tokenizer::Impl::LoadPostProcessor(simdjson::simdjson_result<simdjson::dom::element> spec,
                                          const std::string& path) {
  auto id_of = [&](std::string_view token, int32_t* id) -> Status {
    auto it = vocab.find(std::string(token));
    if (it == vocab.end()) {
      return Status::InvalidArgument(
          fmt::format("{}: the post-processor's token '{}' is not in the vocab", path, token));
    }
    *id = it->second;
    return Status::Ok();
  };
  std::string_view type;
  if (spec["type"].get(type) != simdjson::SUCCESS) return Status::Ok();
  // BertProcessing / RobertaProcessing: [CLS] A [SEP] and [CLS] A [SEP] B [SEP] (RoBERTa:
  // <s> A </s> </s> B </s>), each token given as [text, id].
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    int32_t cls = 0, sep = 0;
    std::string_view text;
    if (spec["cls"].at(0).get(text) != simdjson::SUCCESS) {
      return Status::InvalidArgument(fmt::format("{}: {} without cls", path, type));
    }
    SLUICE_RETURN_IF_ERROR(id_of(text, &cls));
    if (spec["sep"].at(0).get(text) != simdjson::SUCCESS) {
      return Status::InvalidArgument(fmt::format("{}: {} without sep", path, type));
    }
    SLUICE_RETURN_IF_ERROR(id_of(text, &sep));
    prefix = {cls};
    suffix = {sep};
    pair_template = {{cls}, {sep}, {sep}};
    if (type == "RobertaProcessing") pair_template.middle = {sep, sep};
    return Status::Ok();
  }
  if (type != "TemplateProcessing") return Status::Ok();
  // The special tokens around the sequences: before A, between A and B, after B.
  auto read = [&](const char* key, int sequences, std::vector<std::vector<int32_t>>* parts,
                  bool* found) -> Status {
    simdjson::dom::array items;
    *found = spec[key].get(items) == simdjson::SUCCESS;
    if (!*found) return Status::Ok();
    parts->assign(static_cast<size_t>(sequences) + 1, {});
    size_t part = 0;
    for (auto item : items) {
      std::string_view token;
      if (item["SpecialToken"]["id"].get(token) == simdjson::SUCCESS) {
        int32_t id = 0;
        SLUICE_RETURN_IF_ERROR(id_of(token, &id));
        (*parts)[std::min(part, parts->size() - 1)].push_back(id);
      } else {
        ++part;
      }
    }
    return Status::Ok();
  };
  std::vector<std::vector<int32_t>> parts;
  bool found = false;
  SLUICE_RETURN_IF_ERROR(read("single", 1, &parts, &found));
  if (found) {
    prefix = parts[0];
    suffix = parts[1];
  }
  SLUICE_RETURN_IF_ERROR(read("pair", 2, &parts, &found));
  if (found) pair_template = {parts[0], parts[1], parts[2]};
  return Status::Ok();
}

Status ReadHfTokenizerConfig(const std::string& dir, HfTokenizerConfig* out) {
  namespace fs = std::filesystem;
  const fs::path config_path = fs::path(dir) / "tokenizer_config.json";
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    // On demand: these files carry integers simdjson's DOM rejects (model_max_length = 1e30),
    // which on-demand parsing never touches.
    simdjson::ondemand::parser parser;
    simdjson::padded_string text;
    simdjson::ondemand::document config;
    simdjson::ondemand::object root;
    if (simdjson::padded_string::load(config_path.string()).get(text) != simdjson::SUCCESS ||
        parser.iterate(text).get(config) != simdjson::SUCCESS ||
        config.get_object().get(root) != simdjson::SUCCESS) {
      return Status::InvalidArgument(
          fmt::format("{}: cannot read it as JSON", config_path.string()));
    }
    auto read_bool = [](simdjson::ondemand::value value, bool& flag) {
      if (bool read = false; value.get_bool().get(read) == simdjson::SUCCESS) flag = read;
    };
    for (auto field : root) {
      std::string_view key, text_value;
      if (field.unescaped_key().get(key) != simdjson::SUCCESS) continue;
      simdjson::ondemand::value value = field.value();
      if (std::string* token = key == "bos_token"    ? &out->bos
                               : key == "eos_token"  ? &out->eos
                               : key == "unk_token"  ? &out->unk
                               : key == "pad_token"  ? &out->pad
                               : key == "mask_token" ? &out->mask
                                                     : nullptr) {
        simdjson::ondemand::object object;
        if (value.get_string().get(text_value) != simdjson::SUCCESS &&
            (value.get_object().get(object) != simdjson::SUCCESS ||
             object.find_field_unordered("content").get_string().get(text_value) !=
                 simdjson::SUCCESS)) {
          continue;
        }
        *token = std::string(text_value);
      } else if (key == "chat_template" || key == "tokenizer_class") {
        if (value.get_string().get(text_value) == simdjson::SUCCESS) {
          (key == "chat_template" ? out->chat_template : out->tokenizer_class) =
              std::string(text_value);
        }
      } else if (key == "legacy") {
        read_bool(value, out->legacy);  // null: the default.
      } else if (key == "add_bos_token") {
        read_bool(value, out->add_bos);
      } else if (key == "add_eos_token") {
        read_bool(value, out->add_eos);
      } else if (key == "add_prefix_space") {
        read_bool(value, out->add_prefix_space);
      } else if (key == "added_tokens_decoder") {
        simdjson::ondemand::object tokens;
        if (value.get_object().get(tokens) != simdjson::SUCCESS) continue;
        for (auto entry : tokens) {
          std::string_view id_text;
          simdjson::ondemand::object token;
          if (entry.unescaped_key().get(id_text) != simdjson::SUCCESS ||
              entry.value().get_object().get(token) != simdjson::SUCCESS) {
            return Status::InvalidArgument(
                fmt::format("{}: bad added_tokens_decoder entry", config_path.string()));
          }
          const int64_t id = std::atoll(std::string(id_text).c_str());
          AddedToken added_token;
          bool is_special = false;
          for (auto attribute : token) {
            std::string_view name, content;
            if (attribute.unescaped_key().get(name) != simdjson::SUCCESS) continue;
            simdjson::ondemand::value v = attribute.value();
            if (name == "content" && v.get_string().get(content) == simdjson::SUCCESS) {
              added_token.text = std::string(content);
            } else if (name == "lstrip") {
              read_bool(v, added_token.lstrip);
            } else if (name == "rstrip") {
              read_bool(v, added_token.rstrip);
            } else if (name == "special") {
              read_bool(v, is_special);
            }
          }
          if (id < 0 || id > (1 << 24) || added_token.text.empty()) {
            return Status::InvalidArgument(fmt::format(
                "{}: added token '{}' has no content or a bad id", config_path.string(), id_text));
          }
          added_token.id = static_cast<int32_t>(id);
          out->added.emplace_back(std::move(added_token), is_special);
        }
      }
    }
  }
  if (out->chat_template.empty() && fs::exists(fs::path(dir) / "chat_template.jinja", ec)) {
    out->chat_template = ReadFile(fs::path(dir) / "chat_template.jinja");
  }
  return Status::Ok();
}

Status Tokenizer::Impl::LoadTokenizerConfig(const std::string& dir) {
  HfTokenizerConfig config;
  SLUICE_RETURN_IF_ERROR(ReadHfTokenizerConfig(dir, &config));
  bos = std::move(config.bos);
  eos = std::move(config.eos);
  chat_template = std::move(config.chat_template);
  return Status::Ok();
}

// A folder with tokenizer.model (or sentencepiece.bpe.model) and no tokenizer.json (Llama 2 and
// Mistral-era checkpoints, and folders saved without the fast tokenizer) is read as transformers
// reads it. A BPE model with Llama's classes (or none) is converted to the
// tokenizer.json it would write (LlamaConverter): the pieces as the vocabulary, merges of every
// piece that splits into two pieces, ranked by the merged piece's id, then the split's lengths;
// byte fallback as the model file says, the unknown token fused; Metaspace's "▁" in front of each
// segment between added tokens (tokenizer_config.json's "legacy": true) or of the input's first
// only (false or absent, as transformers 5 takes it), whatever the file's add_dummy_prefix; the
// added tokens of tokenizer_config.json's "added_tokens_decoder" and added_tokens.json, and its
// add_bos_token (true unless false) and add_eos_token. A Unigram model with XLM-RoBERTa's classes:
// LoadXlmRobertaSentencePiece (tokenizer_encoders.cc). Other tokenizer classes (Gemma's, T5's)
// convert differently and are refused by name.
Status Tokenizer::Impl::LoadSentencePieceModel(const std::string& dir, const std::string& path) {
  namespace fs = std::filesystem;
  constexpr std::string_view kSpace = "\xE2\x96\x81";
  sentencepiece::ModelProto proto;
  {
    std::ifstream in(path, std::ios::binary);
    if (!in || !proto.ParseFromIstream(&in) || proto.pieces_size() == 0) {
      return Status::InvalidArgument(
          fmt::format("{}: cannot read it as a SentencePiece model", path));
    }
  }
  // tokenizer_config.json's settings and added tokens (ids past the pieces as well).
  HfTokenizerConfig config;
  SLUICE_RETURN_IF_ERROR(ReadHfTokenizerConfig(dir, &config));
  // transformers converts the file by the tokenizer class: Llama's conversion for Llama's classes
  // (Llama 2, Mistral, Phi-3, TinyLlama folders), XLM-RoBERTa's for a Unigram model (its
  // encoders: multilingual-e5, bge-m3); Gemma's and T5's differ.
  const std::string& name = config.tokenizer_class;
  const sentencepiece::TrainerSpec& trainer = proto.trainer_spec();
  const bool xlm_roberta = name == "XLMRobertaTokenizer" || name == "XLMRobertaTokenizerFast";
  if (trainer.model_type() == sentencepiece::TrainerSpec::UNIGRAM && xlm_roberta) {
    return LoadXlmRobertaSentencePiece(proto, config, path);
  }
  if (trainer.model_type() != sentencepiece::TrainerSpec::BPE || xlm_roberta) {
    return Status::InvalidArgument(fmt::format(
        "{}: a SentencePiece {} model with tokenizer_class '{}'; Sluice reads BPE ones with "
        "Llama's classes (Llama 2, Mistral, Phi-3) and UNIGRAM ones with XLM-RoBERTa's, other "
        "kinds from a tokenizer.json",
        path, sentencepiece::TrainerSpec::ModelType_Name(trainer.model_type()), name));
  }
  const sentencepiece::NormalizerSpec& normalizer = proto.normalizer_spec();
  if ((!normalizer.name().empty() && normalizer.name() != "identity") ||
      !normalizer.precompiled_charsmap().empty()) {
    return Status::InvalidArgument(
        fmt::format("{}: normalizer '{}' is not supported (identity)", path, normalizer.name()));
  }
  if (!normalizer.escape_whitespaces() || trainer.treat_whitespace_as_suffix()) {
    return Status::InvalidArgument(
        fmt::format("{}: spaces not escaped as '▁' in front of pieces are not supported", path));
  }
  if (!name.empty() && name != "LlamaTokenizer" && name != "LlamaTokenizerFast" &&
      name != "CodeLlamaTokenizer" && name != "CodeLlamaTokenizerFast") {
    return Status::InvalidArgument(fmt::format(
        "{}/tokenizer_config.json: tokenizer_class '{}' with {} alone is not supported (Sluice "
        "converts Llama's classes' BPE models; give the folder's tokenizer.json)",
        dir, name, fs::path(path).filename().string()));
  }
  std::vector<std::pair<AddedToken, bool>>& config_added = config.added;
  std::error_code ec;
  // added_tokens.json: {"content": id}, tokens that are not special.
  const fs::path added_path = fs::path(dir) / "added_tokens.json";
  if (fs::exists(added_path, ec)) {
    simdjson::dom::parser parser;
    simdjson::dom::object tokens;
    if (parser.load(added_path.string()).get(tokens) != simdjson::SUCCESS) {
      return Status::InvalidArgument(
          fmt::format("{}: cannot read it as JSON", added_path.string()));
    }
    for (auto [content, value] : tokens) {
      int64_t id = -1;
      if (value.get(id) != simdjson::SUCCESS || id < 0 || id > (1 << 24)) {
        return Status::InvalidArgument(fmt::format("{}: bad id", added_path.string()));
      }
      bool known = false;
      for (const auto& [token, is_special] : config_added) known |= token.id == id;
      if (known) continue;
      config_added.emplace_back(AddedToken{std::string(content), static_cast<int32_t>(id)}, false);
    }
  }

  // The pieces: "▁" stands for a space, <0xXX> byte pieces for their byte.
  hf_sentencepiece = true;
  byte_fallback = trainer.byte_fallback();
  fuse_unknown = true;
  // Llama's conversion prepends "▁" whatever the model file's add_dummy_prefix says.
  metaspace = true;
  metaspace_prepend = config.legacy ? MetaspacePrepend::kAlways : MetaspacePrepend::kFirst;
  strip_decoded_space = true;
  int64_t size = proto.pieces_size();
  for (const auto& [token, is_special] : config_added) size = std::max<int64_t>(size, token.id + 1);
  id_bytes.assign(static_cast<size_t>(size), "");
  special.assign(static_cast<size_t>(size), false);
  for (int id = 0; id < proto.pieces_size(); ++id) {
    const sentencepiece::ModelProto::SentencePiece& piece = proto.pieces(id);
    const std::string& token = piece.piece();
    if (!IsValidUtf8(token)) {
      return Status::InvalidArgument(fmt::format("{}: piece {} is not UTF-8", path, id));
    }
    vocab[token] = id;
    std::string& bytes = id_bytes[static_cast<size_t>(id)];
    switch (piece.type()) {
      case sentencepiece::ModelProto::SentencePiece::UNKNOWN:
      case sentencepiece::ModelProto::SentencePiece::CONTROL: {
        bytes = token;
        special[static_cast<size_t>(id)] = true;
        bool listed = false;  // Matched in text as themselves, with the config's attributes.
        for (const auto& [token_listed, is_special] : config_added) listed |= token_listed.id == id;
        if (!listed) added.push_back({token, id});
        break;
      }
      case sentencepiece::ModelProto::SentencePiece::USER_DEFINED:
        bytes = token;
        added.push_back({token, id});
        break;
      case sentencepiece::ModelProto::SentencePiece::BYTE: {
        unsigned value = 0;
        if (token.size() != 6 || !token.starts_with("<0x") || token[5] != '>' ||
            std::sscanf(token.c_str() + 3, "%2x", &value) != 1) {
          return Status::InvalidArgument(
              fmt::format("{}: byte piece {} is '{}', not <0xXX>", path, id, token));
        }
        bytes.assign(1, static_cast<char>(value));
        break;
      }
      case sentencepiece::ModelProto::SentencePiece::UNUSED:
        break;
      default:
        for (size_t i = 0; i < token.size();) {
          if (token.compare(i, kSpace.size(), kSpace) == 0) {
            bytes += ' ';
            i += kSpace.size();
          } else {
            bytes += token[i++];
          }
        }
    }
  }
  const int32_t unk = trainer.unk_id();
  if (unk >= 0 && unk < proto.pieces_size()) unknown_id = unk;
  for (auto& [token, is_special] : config_added) {
    const size_t id = static_cast<size_t>(token.id);
    if (static_cast<int64_t>(id) >= proto.pieces_size() || id_bytes[id].empty() ||
        id_bytes[id] == token.text) {
      id_bytes[id] = token.text;
      special[id] = special[id] || is_special;
      vocab[token.text] = token.id;
    }
    added.push_back(std::move(token));
  }
  // The merges transformers' conversion makes: every split of a piece into two pieces.
  struct Merge {
    int32_t merged;
    size_t left_size, right_size;
    std::string left, right;
  };
  std::vector<Merge> merge_list;
  for (int id = 0; id < proto.pieces_size(); ++id) {
    const std::string& token = proto.pieces(id).piece();
    for (size_t split = 1; split < token.size(); ++split) {
      std::string left = token.substr(0, split), right = token.substr(split);
      if (vocab.contains(left) && vocab.contains(right)) {
        merge_list.push_back({id, left.size(), right.size(), std::move(left), std::move(right)});
      }
    }
  }
  // transformers measures the split in characters; ranks only order merges of the same piece by
  // it, and the byte lengths order them alike.
  std::stable_sort(merge_list.begin(), merge_list.end(), [](const Merge& a, const Merge& b) {
    return std::tie(a.merged, a.left_size, a.right_size) <
           std::tie(b.merged, b.left_size, b.right_size);
  });
  int32_t rank = 0;
  for (const Merge& merge : merge_list) {
    SLUICE_RETURN_IF_ERROR(AddMerge(merge.left, merge.right, rank++, path));
  }
  Finish();
  bos = std::move(config.bos);
  eos = std::move(config.eos);
  chat_template = std::move(config.chat_template);
  auto id_of = [&](const std::string& token) -> int32_t {
    auto it = vocab.find(token);
    return it == vocab.end() ? -1 : it->second;
  };
  if (bos.empty() && trainer.bos_id() >= 0 && trainer.bos_id() < proto.pieces_size()) {
    bos = proto.pieces(trainer.bos_id()).piece();
  }
  if (eos.empty() && trainer.eos_id() >= 0 && trainer.eos_id() < proto.pieces_size()) {
    eos = proto.pieces(trainer.eos_id()).piece();
  }
  if (config.add_bos && id_of(bos) >= 0) prefix.push_back(id_of(bos));
  if (config.add_eos && id_of(eos) >= 0) suffix.push_back(id_of(eos));
  return Status::Ok();
}

// tokenizer.json's SentencePiece-style parts: byte_fallback, a normalizer of Prepend and Replace
// steps (Llama 2's legacy one: Prepend "▁", Replace " " with "▁"), a Metaspace pre-tokenizer
// (transformers' newer conversions), and whether the decoder drops the space in front. Other
// normalizers (Unicode forms, lowercasing, SentencePiece's precompiled maps) are refused by name.
Status Tokenizer::Impl::LoadHfSentencePiece(simdjson::dom::element root, const std::string& path) {
  constexpr std::string_view kSpace = "\xE2\x96\x81";
  simdjson::dom::element model = root["model"];
  ReadOptional(model["byte_fallback"], byte_fallback);
  auto refuse = [&](std::string_view what, std::string_view type) {
    return Status::InvalidArgument(fmt::format("{}: {} '{}' is not supported", path, what, type));
  };
  // The normalizer: null, one step, or a Sequence of steps.
  simdjson::dom::element normalizer;
  if (root["normalizer"].get(normalizer) == simdjson::SUCCESS && !normalizer.is_null()) {
    std::vector<simdjson::dom::element> steps_json;
    std::string_view type;
    ReadOptional(normalizer["type"], type);
    simdjson::dom::array list;
    if (type == "Sequence" && normalizer["normalizers"].get(list) == simdjson::SUCCESS) {
      for (auto item : list) steps_json.push_back(item);
    } else {
      steps_json.push_back(normalizer);
    }
    for (simdjson::dom::element step : steps_json) {
      std::string_view kind, text, content;
      ReadOptional(step["type"], kind);
      if (kind == "Prepend" && step["prepend"].get(text) == simdjson::SUCCESS) {
        normalizer_prepend = std::string(text);
      } else if (kind == "Replace" && step["pattern"]["String"].get(text) == simdjson::SUCCESS &&
                 step["content"].get(content) == simdjson::SUCCESS && text == " " &&
                 content == kSpace) {
        normalizer_spaces = true;
      } else {
        return refuse("normalizer", kind);
      }
    }
    hf_sentencepiece = true;
  }
  simdjson::dom::element pre;
  std::string_view pre_type;
  if (root["pre_tokenizer"].get(pre) == simdjson::SUCCESS && !pre.is_null() &&
      pre["type"].get(pre_type) == simdjson::SUCCESS && pre_type == "Metaspace") {
    std::string_view replacement, scheme;
    if (pre["replacement"].get(replacement) == simdjson::SUCCESS && replacement != kSpace) {
      return refuse("Metaspace replacement", replacement);
    }
    bool add_prefix_space = true;
    if (pre["prepend_scheme"].get(scheme) == simdjson::SUCCESS) {
      if (scheme == "first") {
        metaspace_prepend = MetaspacePrepend::kFirst;
      } else if (scheme == "never") {
        metaspace_prepend = MetaspacePrepend::kNever;
      } else if (scheme != "always") {
        return refuse("Metaspace prepend_scheme", scheme);
      }
    } else if (pre["add_prefix_space"].get(add_prefix_space) == simdjson::SUCCESS &&
               !add_prefix_space) {
      metaspace_prepend = MetaspacePrepend::kNever;
    }
    ReadOptional(pre["split"], metaspace_split);
    metaspace = true;
    hf_sentencepiece = true;
  }
  if (byte_fallback) hf_sentencepiece = true;
  if (!hf_sentencepiece) return Status::Ok();
  // The decoder: a Strip of one leading space (in a Sequence), or Metaspace's own.
  simdjson::dom::element decoder;
  if (root["decoder"].get(decoder) == simdjson::SUCCESS && !decoder.is_null()) {
    std::vector<simdjson::dom::element> parts;
    std::string_view type;
    ReadOptional(decoder["type"], type);
    simdjson::dom::array list;
    if (type == "Sequence" && decoder["decoders"].get(list) == simdjson::SUCCESS) {
      for (auto item : list) parts.push_back(item);
    } else {
      parts.push_back(decoder);
    }
    for (simdjson::dom::element part : parts) {
      std::string_view kind, scheme;
      ReadOptional(part["type"], kind);
      int64_t start = 0;
      if (kind == "Strip" && part["start"].get(start) == simdjson::SUCCESS && start >= 1) {
        strip_decoded_space = true;
      }
      if (kind == "Metaspace") {
        bool prefix = true;
        if (part["prepend_scheme"].get(scheme) == simdjson::SUCCESS) prefix = scheme != "never";
        ReadOptional(part["add_prefix_space"], prefix);
        strip_decoded_space |= prefix;
      }
    }
  }
  return Status::Ok();
}

bool Tokenizer::Impl::ByteLevelBytes(const std::string& token, std::string* bytes) const {
  bytes->clear();
  for (size_t i = 0; i < token.size();) {
    const int len = SequenceLength(std::string_view(token).substr(i));
    if (len <= 0) return false;
    uint32_t cp = static_cast<unsigned char>(token[i]) & (len == 1 ? 0x7F : (0x7F >> len));
    for (int j = 1; j < len; ++j)
      cp = (cp << 6) | (static_cast<unsigned char>(token[i + static_cast<size_t>(j)]) & 0x3F);
    auto it = cp_byte.find(cp);
    if (it == cp_byte.end()) {  // Not byte-level: keep the text itself.
      bytes->append(token, i, static_cast<size_t>(len));
    } else {
      *bytes += static_cast<char>(it->second);
    }
    i += static_cast<size_t>(len);
  }
  return true;
}

Status Tokenizer::Impl::AddMerge(const std::string& left, const std::string& right, int32_t rank,
                                 const std::string& source) {
  auto l = vocab.find(left), r = vocab.find(right), m = vocab.find(left + right);
  if (l == vocab.end() || r == vocab.end() || m == vocab.end()) {
    return Status::InvalidArgument(
        fmt::format("{}: merge '{} {}' names a token not in the vocab", source, left, right));
  }
  const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
  merges.emplace(key, std::make_pair(rank, m->second));
  return Status::Ok();
}

void Tokenizer::Impl::Finish() {
  std::stable_sort(added.begin(), added.end(),
                   [](const auto& a, const auto& b) { return a.text.size() > b.text.size(); });
  const std::vector<uint32_t> byte_cp = ByteToCodePoint();
  byte_ids.assign(256, -1);
  for (uint32_t b = 0; b < 256; ++b) {
    std::string ch;
    AppendUtf8(byte_cp[b], ch);
    auto it = vocab.find(ch);
    if (it != vocab.end()) byte_ids[b] = it->second;
  }
}

// llama.cpp's pre-tokenizer types (tokenizer.ggml.pre) that Sluice reads, as PCRE2 patterns
// applied in sequence, each isolating its matches.
struct GgufPreTokenizer {
  const char* names[4];
  std::vector<const char*> patterns;
  bool ignore_merges;
  bool add_bos;  // When the file does not say (tokenizer.ggml.add_bos_token).
};

const std::vector<GgufPreTokenizer>& GgufPreTokenizers() {
  static const auto* table = new std::vector<GgufPreTokenizer>{
      {{"default", "gpt-2", "phi-2", "roberta-bpe"}, {kByteLevelPattern}, false, false},
      {{"smollm", "starcoder", "refact", nullptr}, {R"(\p{N})", kByteLevelPattern}, false, false},
      {{"qwen2", "deepseek-r1-qwen", "stablelm2", nullptr},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false,
       false},
      {{"llama-bpe", "llama3", "llama-v3", "falcon3"},
       {R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true,
       true},
      // o200k (GPT-4o's, gpt-oss's and Llama 4's vocabularies): words split at case changes,
      // their contractions kept, numbers in threes, punctuation with its trailing newlines and
      // slashes.
      {{"gpt-4o", "llama4", nullptr, nullptr},
       {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       false,
       false},
  };
  return *table;
}

// Whether `name` (general.name, lowercased) is a Phi-3 model's: llama.cpp then strips the
// whitespace after its special tokens, as Phi-3's own tokenizer does.
bool IsPhi3Name(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return name.find("phi-3") != std::string::npos || name.find("phi3") != std::string::npos;
}

// GGUF's tokenizer: tokenizer.ggml.model "gpt2" (byte-level BPE: tokens, token types, merges, the
// pre-tokenizer type) or "llama" (SentencePiece: tokens, scores, token types), then the special
// token ids, whether to add BOS/EOS, and the chat template.
Status Tokenizer::Impl::LoadGguf(const GgufFile& file) {
  const std::string& path = file.path();
  auto model = file.String("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model != "gpt2" && *model != "llama" && *model != "bert" && *model != "t5") {
    return Status::InvalidArgument(fmt::format(
        "{}: tokenizer.ggml.model '{}' is not supported (Sluice reads 'gpt2', byte-level BPE, "
        "'llama', SentencePiece BPE, 'bert', WordPiece, and 't5', SentencePiece Unigram)",
        path, *model));
  }
  auto tokens = file.Strings("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.status();
  auto types = file.Integers("tokenizer.ggml.token_type");
  if (!types.ok()) return types.status();
  if ((*types)->size() != (*tokens)->size()) {
    return Status::InvalidArgument(
        fmt::format("{}: {} token types for {} tokens", path, (*types)->size(), (*tokens)->size()));
  }
  const size_t count = (*tokens)->size();
  bool default_add_bos = true;
  if (*model == "llama") {
    SLUICE_RETURN_IF_ERROR(LoadGgufSentencePiece(file, **tokens, **types));
  } else if (*model == "bert") {
    SLUICE_RETURN_IF_ERROR(LoadGgufWordPiece(file, **tokens, **types));
  } else if (*model == "t5") {
    SLUICE_RETURN_IF_ERROR(LoadGgufUnigram(file, **tokens, **types));
  } else {
    auto pre = file.String("tokenizer.ggml.pre", "default");
    if (!pre.ok()) return pre.status();
    const GgufPreTokenizer* pre_tokenizer = nullptr;
    for (const GgufPreTokenizer& candidate : GgufPreTokenizers()) {
      for (const char* name : candidate.names) {
        if (name != nullptr && *pre == name) pre_tokenizer = &candidate;
      }
    }
    if (pre_tokenizer == nullptr) {
      return Status::InvalidArgument(fmt::format(
          "{}: tokenizer.ggml.pre '{}' is not supported (default, gpt-2, roberta-bpe, smollm, "
          "qwen2, llama-bpe)",
          path, *pre));
    }
    for (const char* pattern : pre_tokenizer->patterns) {
      auto regex = CompileRegex(pattern);
      if (!regex.ok()) return regex.status();
      PreTokenizerStep step;
      step.regex = *regex;
      steps.push_back(std::move(step));
    }
    ignore_merges = pre_tokenizer->ignore_merges;
    default_add_bos = pre_tokenizer->add_bos;
    id_bytes.assign(count, "");
    special.assign(count, false);
    for (size_t id = 0; id < count; ++id) {
      const std::string& token = (**tokens)[id];
      const int64_t type = (**types)[id];
      vocab.emplace(token, static_cast<int32_t>(id));
      if (type == kGgufControl || type == kGgufUserDefined) {  // Matched in text as themselves.
        id_bytes[id] = token;
        special[id] = type == kGgufControl;
        added.push_back({token, static_cast<int32_t>(id)});
      } else if (!ByteLevelBytes(token, &id_bytes[id])) {
        return Status::InvalidArgument(fmt::format("{}: token {} is not UTF-8", path, id));
      }
    }
    auto merge_list = file.Strings("tokenizer.ggml.merges");
    if (!merge_list.ok()) return merge_list.status();
    int32_t rank = 0;
    for (const std::string& merge : **merge_list) {
      const size_t space = merge.find(' ', 1);
      if (space == std::string::npos) {
        return Status::InvalidArgument(fmt::format("{}: merge '{}' has no space", path, merge));
      }
      SLUICE_RETURN_IF_ERROR(
          AddMerge(merge.substr(0, space), merge.substr(space + 1), rank++, path));
    }
  }
  auto name = file.String("general.name", "");
  if (!name.ok()) return name.status();
  if (IsPhi3Name(*name)) {
    for (AddedToken& token : added) {
      token.rstrip = token.text != "<unk>" && token.text != "<s>" && token.text != "<|endoftext|>";
    }
  }
  Finish();
  auto token_of = [&](const char* key, std::string* out) -> Status {
    auto id = file.Integer(key, -1);
    if (!id.ok()) return id.status();
    if (*id >= static_cast<int64_t>(count)) {
      return Status::InvalidArgument(fmt::format("{}: '{}' is outside the vocabulary", path, key));
    }
    if (*id >= 0) *out = (**tokens)[static_cast<size_t>(*id)];
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(token_of("tokenizer.ggml.bos_token_id", &bos));
  SLUICE_RETURN_IF_ERROR(token_of("tokenizer.ggml.eos_token_id", &eos));
  auto add_bos = file.Bool("tokenizer.ggml.add_bos_token", default_add_bos);
  if (!add_bos.ok()) return add_bos.status();
  if (*add_bos && !bos.empty()) prefix.push_back(vocab.at(bos));
  auto add_eos = file.Bool("tokenizer.ggml.add_eos_token", false);
  if (!add_eos.ok()) return add_eos.status();
  if (*add_eos && !eos.empty()) suffix.push_back(vocab.at(eos));
  auto architecture = file.String("general.architecture", "");
  if (!architecture.ok()) return architecture.status();
  const bool encoder = *architecture == "bert" || *architecture == "nomic-bert";
  if ((wordpiece || unigram || encoder) && !bos.empty() && !eos.empty()) {
    // An encoder's pair, as llama.cpp joins a query and a document: bos A eos [sep] B eos, the
    // separator where tokenizer.ggml.add_sep_token says (BERT's [CLS] A [SEP] B [SEP], its eos
    // being [SEP]; RoBERTa's and XLM-RoBERTa's <s> A </s></s> B </s>, a byte-level BPE
    // vocabulary's or a Unigram one's).
    std::vector<int32_t> middle = {vocab.at(eos)};
    std::string separator;
    SLUICE_RETURN_IF_ERROR(token_of("tokenizer.ggml.seperator_token_id", &separator));
    auto add_sep = file.Bool("tokenizer.ggml.add_sep_token", false);
    if (!add_sep.ok()) return add_sep.status();
    if (*add_sep && !separator.empty()) middle.push_back(vocab.at(separator));
    pair_template = {{vocab.at(bos)}, middle, {vocab.at(eos)}};
  }
  auto chat = file.String("tokenizer.chat_template", "");
  if (!chat.ok()) return chat.status();
  chat_template = *chat;
  return Status::Ok();
}

Status Tokenizer::Impl::LoadGgufSentencePiece(const GgufFile& file,
                                              const std::vector<std::string>& tokens,
                                              const std::vector<int64_t>& types) {
  const std::string& path = file.path();
  const size_t count = tokens.size();
  sentencepiece = true;
  scores.assign(count, 0.0f);
  if (const GgufValue* value = file.Find("tokenizer.ggml.scores"); value != nullptr) {
    if (auto floats = file.Numbers("tokenizer.ggml.scores"); floats.ok()) {
      if ((*floats)->size() < count) {
        return Status::InvalidArgument(
            fmt::format("{}: {} token scores for {} tokens", path, (*floats)->size(), count));
      }
      for (size_t id = 0; id < count; ++id) scores[id] = static_cast<float>((**floats)[id]);
    } else if (auto integers = file.Integers("tokenizer.ggml.scores"); integers.ok()) {
      if ((*integers)->size() < count) {
        return Status::InvalidArgument(
            fmt::format("{}: {} token scores for {} tokens", path, (*integers)->size(), count));
      }
      for (size_t id = 0; id < count; ++id) scores[id] = static_cast<float>((**integers)[id]);
    } else {
      return floats.status();
    }
  }
  auto space_prefix = file.Bool("tokenizer.ggml.add_space_prefix", true);
  if (!space_prefix.ok()) return space_prefix.status();
  add_space_prefix = *space_prefix;
  return LoadSentencePieceVocabulary(path, tokens, types);
}

Status Tokenizer::Impl::LoadSentencePieceVocabulary(const std::string& path,
                                                    const std::vector<std::string>& tokens,
                                                    const std::vector<int64_t>& types) {
  const size_t count = tokens.size();
  sentencepiece = true;
  id_bytes.assign(count, "");
  special.assign(count, false);
  for (size_t id = 0; id < count; ++id) {
    // As llama.cpp reads them: an empty token is named so it cannot match text; a later token of
    // the same text shadows an earlier one.
    const std::string token = tokens[id].empty() ? fmt::format("[EMPTY_{}]", id) : tokens[id];
    if (!IsValidUtf8(token)) {
      return Status::InvalidArgument(fmt::format("{}: token {} is not UTF-8", path, id));
    }
    vocab[token] = static_cast<int32_t>(id);
    switch (types[id]) {
      case kGgufUnknown:
      case kGgufControl:
        id_bytes[id] = token;
        special[id] = true;
        added.push_back({token, static_cast<int32_t>(id)});
        if (types[id] == kGgufUnknown) unknown_id = static_cast<int32_t>(id);
        break;
      case kGgufUserDefined:
        id_bytes[id] = token;
        added.push_back({token, static_cast<int32_t>(id)});
        break;
      case kGgufByte: {
        unsigned value = 0;
        if (token.size() != 6 || token.rfind("<0x", 0) != 0 || token[5] != '>' ||
            std::sscanf(token.c_str() + 3, "%2x", &value) != 1) {
          return Status::InvalidArgument(
              fmt::format("{}: byte token {} is '{}', not <0xXX>", path, id, token));
        }
        id_bytes[id] = std::string(1, static_cast<char>(value));
        break;
      }
      case kGgufUnused:
        break;    // Decodes to nothing, as in llama.cpp.
      default: {  // Normal: "▁" stands for a space.
        std::string& text = id_bytes[id];
        for (size_t i = 0; i < token.size();) {
          if (token.compare(i, 3, "\xE2\x96\x81") == 0) {
            text += ' ';
            i += 3;
          } else {
            text += token[i++];
          }
        }
      }
    }
  }
  // Byte fallback: <0xXX> (a later token of the same text wins, as above), else the byte itself.
  for (int b = 0; b < 256; ++b) {
    auto it = vocab.find(fmt::format("<0x{:02X}>", b));
    if (it == vocab.end()) it = vocab.find(std::string(1, static_cast<char>(b)));
    if (it != vocab.end()) byte_tokens[static_cast<size_t>(b)] = it->second;
  }
  return Status::Ok();
}

// Applies the pre-tokenizer steps in turn; each step splits every piece the previous one made.
void Tokenizer::Impl::Split(std::string_view text, std::vector<std::string_view>& pieces) const {
  std::vector<std::string_view> current{text}, next;
  pcre2_match_data* match = nullptr;
  for (const PreTokenizerStep& step : steps) {
    if (!step.regex) continue;
    if (match == nullptr) match = pcre2_match_data_create(4, nullptr);
    next.clear();
    for (std::string_view piece : current) {
      size_t offset = 0, last = 0;
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      while (offset < piece.size()) {
        const int rc = pcre2_match(step.regex->code, subject, piece.size(), offset,
                                   PCRE2_NO_UTF_CHECK, match, nullptr);
        if (rc < 0) break;
        const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match);
        const size_t begin = ovector[0], end = ovector[1];
        if (begin > last) next.push_back(piece.substr(last, begin - last));
        if (end > begin && step.kind == PreTokenizerStep::kIsolate) {
          next.push_back(piece.substr(begin, end - begin));
        }
        last = end;
        if (end == begin) {  // An empty match: step over one character.
          offset = end + 1;
          while (offset < piece.size() &&
                 (static_cast<unsigned char>(piece[offset]) & 0xC0) == 0x80)
            ++offset;
        } else {
          offset = end;
        }
      }
      if (last < piece.size()) next.push_back(piece.substr(last));
    }
    current.swap(next);
  }
  if (match != nullptr) pcre2_match_data_free(match);
  for (std::string_view piece : current) {
    if (!piece.empty()) pieces.push_back(piece);
  }
}

// BPE on one pre-tokenized piece: start from its bytes, merge the lowest-ranked adjacent pair
// until none is left (a heap of candidate pairs over a linked list: n log n).
void Tokenizer::Impl::EncodeWord(std::string_view word, std::vector<int32_t>& ids) const {
  if (ignore_merges) {
    std::string characters;
    for (char byte : word) AppendUtf8(byte_cp_table[static_cast<unsigned char>(byte)], characters);
    if (auto it = vocab.find(characters); it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> initial;
  initial.reserve(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const int32_t id = byte_ids[static_cast<unsigned char>(word[i])];
    if (id < 0) continue;  // A byte the vocab lacks: dropped (the tokenizers package does too).
    initial.push_back(id);
  }
  MergeByRank(initial, ids);
}

// The merges, lowest rank first, over a word's initial symbols: a heap of candidate pairs over a
// linked list (n log n).
void Tokenizer::Impl::MergeByRank(const std::vector<int32_t>& initial,
                                  std::vector<int32_t>& ids) const {
  struct Symbol {
    int32_t id;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(initial.size());
  for (int32_t id : initial) {
    const int n = static_cast<int>(symbols.size());
    symbols.push_back({id, n - 1, n + 1});
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;
  struct Candidate {
    int32_t rank;
    int left;
    int32_t left_id, right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto consider = [&](int left) {
    if (left < 0) return;
    const int right = symbols[static_cast<size_t>(left)].next;
    if (right < 0) return;
    const int32_t a = symbols[static_cast<size_t>(left)].id,
                  b = symbols[static_cast<size_t>(right)].id;
    auto it = merges.find((static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b));
    if (it != merges.end()) heap.push({it->second.first, left, a, b});
  };
  for (int i = 0; i + 1 < static_cast<int>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = symbols[static_cast<size_t>(c.left)];
    if (left.id != c.left_id || left.next < 0) continue;  // Stale.
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    if (right.id != c.right_id) continue;
    left.id =
        merges.at((static_cast<uint64_t>(c.left_id) << 32) | static_cast<uint32_t>(c.right_id))
            .second;
    right.id = -1;  // Removed.
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = c.left;
    consider(left.prev);
    consider(c.left);
  }
  for (int i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next)
    ids.push_back(symbols[static_cast<size_t>(i)].id);
}

void Tokenizer::Impl::EncodeHfSentencePiece(std::string_view text, bool at_start,
                                            std::vector<int32_t>& ids) const {
  constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁"
  std::string normalized = normalizer_prepend;
  normalized.reserve(normalized.size() + text.size() + 8);
  for (char c : text) {
    if (c == ' ' && (normalizer_spaces || metaspace)) {
      normalized += kSpace;
    } else {
      normalized += c;
    }
  }
  if (metaspace && !normalized.starts_with(kSpace) &&
      (metaspace_prepend == MetaspacePrepend::kAlways ||
       (metaspace_prepend == MetaspacePrepend::kFirst && at_start))) {
    normalized.insert(0, kSpace);
  }
  if (!metaspace_split) return EncodeHfSentencePieceWord(normalized, ids);
  // Split before each "▁" (it starts the next word).
  size_t begin = 0;
  for (size_t at = normalized.find(kSpace, 1); at != std::string::npos;
       at = normalized.find(kSpace, at + kSpace.size())) {
    EncodeHfSentencePieceWord(std::string_view(normalized).substr(begin, at - begin), ids);
    begin = at;
  }
  EncodeHfSentencePieceWord(std::string_view(normalized).substr(begin), ids);
}

void Tokenizer::Impl::EncodeHfSentencePieceWord(std::string_view word,
                                                std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  if (ignore_merges) {
    if (auto it = vocab.find(std::string(word)); it != vocab.end()) {
      ids.push_back(it->second);
      return;
    }
  }
  std::vector<int32_t> initial;
  bool last_unknown = false;
  for (size_t at = 0; at < word.size();) {
    const int len = SequenceLength(word.substr(at));
    const size_t size = len > 0 ? static_cast<size_t>(len) : 1;
    const std::string character(word.substr(at, size));
    at += size;
    if (auto it = vocab.find(character); it != vocab.end()) {
      initial.push_back(it->second);
      last_unknown = false;
      continue;
    }
    if (byte_fallback) {
      std::vector<int32_t> bytes;
      for (char byte : character) {
        auto it = vocab.find(fmt::format("<0x{:02X}>", static_cast<unsigned char>(byte)));
        if (it == vocab.end()) break;
        bytes.push_back(it->second);
      }
      if (bytes.size() == character.size()) {
        initial.insert(initial.end(), bytes.begin(), bytes.end());
        last_unknown = false;
        continue;
      }
    }
    if (unknown_id >= 0 && !(fuse_unknown && last_unknown)) initial.push_back(unknown_id);
    last_unknown = true;
  }
  MergeByRank(initial, ids);
}

void Tokenizer::Impl::EncodeSentencePiece(std::string_view text, bool space_prefix,
                                          std::vector<int32_t>& ids) const {
  constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁"
  std::string escaped;
  escaped.reserve(text.size() + 8);
  if (space_prefix) escaped += kSpace;
  for (char c : text) {
    if (c == ' ') {
      escaped += kSpace;
    } else {
      escaped += c;
    }
  }
  if (escaped.empty()) return;
  // Characters (by their lead byte, as llama.cpp counts them), linked in a list.
  struct Symbol {
    size_t begin, size;
    int prev, next;
  };
  std::vector<Symbol> symbols;
  for (size_t at = 0; at < escaped.size();) {
    static constexpr size_t kLength[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    const size_t size =
        std::min(kLength[static_cast<unsigned char>(escaped[at]) >> 4], escaped.size() - at);
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({at, size, index - 1, at + size == escaped.size() ? -1 : index + 1});
    at += size;
  }
  struct Bigram {
    float score;
    int left, right;
    size_t size;
  };
  // The highest score first; among equals, the leftmost.
  auto lower = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(lower)> queue(lower);
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    auto it = vocab.find(escaped.substr(l.begin, l.size + r.size));
    if (it == vocab.end()) return;
    queue.push({scores[static_cast<size_t>(it->second)], left, right, l.size + r.size});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<size_t>(bigram.left)];
    Symbol& right = symbols[static_cast<size_t>(bigram.right)];
    if (left.size == 0 || right.size == 0 || left.size + right.size != bigram.size) continue;
    left.size += right.size;  // Stale pairs fail the size check above.
    right.size = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<size_t>(right.next)].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }
  for (int i = 0; i != -1; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& symbol = symbols[static_cast<size_t>(i)];
    auto it = vocab.find(escaped.substr(symbol.begin, symbol.size));
    if (it != vocab.end()) {
      ids.push_back(it->second);
      continue;
    }
    // No token: its bytes, each as its byte token (or the unknown token where there is none).
    for (size_t j = 0; j < symbol.size; ++j) {
      const int32_t id = byte_tokens[static_cast<unsigned char>(escaped[symbol.begin + j])];
      if (id >= 0) {
        ids.push_back(id);
      } else if (unknown_id >= 0) {
        ids.push_back(unknown_id);
        break;
      }
    }
  }
}

void Tokenizer::Impl::EncodeText(std::string_view text, bool after_special, bool at_start,
                                 std::vector<int32_t>& ids) const {
  if (wordpiece) return wordpiece->Encode(text, ids);
  if (unigram) return unigram->Encode(text, ids);
  if (sentencepiece) return EncodeSentencePiece(text, add_space_prefix && after_special, ids);
  if (hf_sentencepiece) return EncodeHfSentencePiece(text, at_start, ids);
  std::string prefixed;
  for (const PreTokenizerStep& step : steps) {
    if (step.add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed.assign(1, ' ').append(text);
      text = prefixed;
      break;
    }
  }
  std::vector<std::string_view> pieces;
  Split(text, pieces);
  for (std::string_view piece : pieces) EncodeWord(piece, ids);
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  auto impl = std::make_unique<Impl>();
  SLUICE_RETURN_IF_ERROR(impl->Load(dir));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  auto impl = std::make_unique<Impl>();
  SLUICE_RETURN_IF_ERROR(impl->LoadGguf(file));
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = impl_->prefix;
  // Added tokens first: the earliest occurrence, the longest at one position (added is sorted
  // longest first). Each token's next occurrence is searched again only once it is passed.
  const auto& added = impl_->added;
  std::vector<size_t> next(added.size(), 0);
  for (size_t i = 0; i < added.size(); ++i) next[i] = text.find(added[i].text);
  auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  size_t begin = 0;
  bool after_special = true;  // The start counts as following a special token.
  while (begin < text.size()) {
    size_t found = std::string_view::npos, match = 0;
    for (size_t i = 0; i < added.size(); ++i) {
      if (next[i] != std::string_view::npos && next[i] < begin) {
        next[i] = text.find(added[i].text, begin);
      }
      if (next[i] < found) {
        found = next[i];
        match = i;
      }
    }
    if (found == std::string_view::npos) {
      impl_->EncodeText(text.substr(begin), after_special, begin == 0, ids);
      break;
    }
    std::string_view before = text.substr(begin, found - begin);
    if (added[match].lstrip) {
      while (!before.empty() && is_space(before.back())) before.remove_suffix(1);
    }
    if (!before.empty()) impl_->EncodeText(before, after_special, begin == 0, ids);
    ids.push_back(added[match].id);
    after_special = true;
    begin = found + added[match].text.size();
    if (added[match].rstrip) {
      while (begin < text.size() && is_space(text[begin])) ++begin;
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), impl_->suffix.begin(), impl_->suffix.end());
  return ids;
}

std::vector<int32_t> Tokenizer::EncodePair(std::string_view first, std::string_view second) const {
  const PairTemplate& pair = impl_->pair_template;
  std::vector<int32_t> ids = pair.prefix;
  const std::vector<int32_t> a = Encode(first), b = Encode(second);
  ids.insert(ids.end(), a.begin(), a.end());
  ids.insert(ids.end(), pair.middle.begin(), pair.middle.end());
  ids.insert(ids.end(), b.begin(), b.end());
  ids.insert(ids.end(), pair.suffix.begin(), pair.suffix.end());
  return ids;
}

bool Tokenizer::has_pair_template() const { return !impl_->pair_template.empty(); }
const PairTemplate& Tokenizer::pair_template() const { return impl_->pair_template; }

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special) const {
  // A SentencePiece vocabulary's space in front of the text is dropped again from the first
  // token, unless that is a BOS token left out (llama.cpp's llama_detokenize).
  bool strip_space = impl_->sentencepiece && impl_->add_space_prefix;
  size_t first = 0;
  if (skip_special && !ids.empty() && !impl_->bos.empty() && ids[0] == TokenId(impl_->bos)) {
    strip_space = false;
    first = 1;
  }
  std::string bytes;
  for (size_t i = first; i < ids.size(); ++i) {
    if (skip_special && IsSpecial(ids[i])) continue;
    const std::string& piece = TokenBytes(ids[i]);
    bytes.append(piece, i == first && strip_space && piece.starts_with(' ') ? 1 : 0);
  }
  // tokenizer.json's decoders (Strip, Metaspace) drop one space in front of the whole text.
  if (impl_->strip_decoded_space && bytes.starts_with(' ')) bytes.erase(0, 1);
  return Utf8Lossy(bytes);
}

const std::string& Tokenizer::TokenBytes(int32_t id) const {
  static const std::string kEmpty;
  if (id < 0 || static_cast<size_t>(id) >= impl_->id_bytes.size()) return kEmpty;
  return impl_->id_bytes[static_cast<size_t>(id)];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < impl_->special.size() &&
         impl_->special[static_cast<size_t>(id)];
}

int32_t Tokenizer::TokenId(std::string_view token) const {
  auto it = impl_->vocab.find(std::string(token));
  return it == impl_->vocab.end() ? -1 : it->second;
}

int Tokenizer::vocab_size() const { return static_cast<int>(impl_->id_bytes.size()); }
const std::string& Tokenizer::bos_token() const { return impl_->bos; }
const std::string& Tokenizer::eos_token() const { return impl_->eos; }
const std::string& Tokenizer::chat_template() const { return impl_->chat_template; }

std::string StreamDecoder::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return "";
  pending_ += tokenizer_.TokenBytes(id);
  const size_t complete = CompleteUtf8Prefix(pending_);
  std::string out = Utf8Lossy(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string StreamDecoder::Flush() {
  std::string out = Utf8Lossy(pending_);
  pending_.clear();
  return out;
}

size_t CompleteUtf8Prefix(std::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const int len = SequenceLength(bytes.substr(i));
    if (len < 0) return i;  // Unfinished character at the end.
    i += len == 0 ? 1 : static_cast<size_t>(len);
  }
  return i;
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    const int len = SequenceLength(bytes.substr(i));
    if (len > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
    } else {
      out += "\xEF\xBF\xBD";
      // Like from_utf8_lossy: a maximal invalid prefix of a sequence becomes one U+FFFD.
      size_t skip = 1;
      while (i + skip < bytes.size() && skip < 4 &&
             (static_cast<unsigned char>(bytes[i + skip]) & 0xC0) == 0x80 && len < 0) {
        ++skip;
      }
      i += len < 0 ? bytes.size() - i : skip;
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const int len = SequenceLength(bytes.substr(i));
    if (len <= 0) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

}  // namespace sluice::llm
