#include "llm/files/gguf.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <utility>

namespace sluice::llm {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF", little-endian.
constexpr int kMaxDims = 4;

// The format's value types.
enum ValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

Status Invalid(const std::string& path, const std::string& what) {
  return Status::InvalidArgument(fmt::format("{}: not a valid GGUF file: {}", path, what));
}

// Reads little-endian values from [pos, end), every read checked against the end.
class Cursor {
 public:
  Cursor(const uint8_t* begin, const uint8_t* end) : begin_(begin), pos_(begin), end_(end) {}

  template <class T>
  bool Read(T* out) {
    if (static_cast<size_t>(end_ - pos_) < sizeof(T)) return false;
    std::memcpy(out, pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  bool ReadString(std::string* out) {
    uint64_t length = 0;
    if (!Read(&length) || length > static_cast<uint64_t>(end_ - pos_)) return false;
    out->assign(reinterpret_cast<const char*>(pos_), static_cast<size_t>(length));
    pos_ += length;
    return true;
  }
  size_t offset() const { return static_cast<size_t>(pos_ - begin_); }
  size_t left() const { return static_cast<size_t>(end_ - pos_); }

 private:
  const uint8_t* begin_;
  const uint8_t* pos_;
  const uint8_t* end_;
};

// One scalar of `type` into `value` (kind and field); false when the file ends or the type is
// not a scalar type.
bool ReadScalar(Cursor& in, uint32_t type, GgufValue* value, std::string* error) {
  auto integer = [&](auto v) {
    value->kind = GgufValue::kInteger;
    value->integer = static_cast<int64_t>(v);
    return true;
  };
  switch (type) {
    case kU8: {
      uint8_t v;
      return in.Read(&v) && integer(v);
    }
    case kI8: {
      int8_t v;
      return in.Read(&v) && integer(v);
    }
    case kU16: {
      uint16_t v;
      return in.Read(&v) && integer(v);
    }
    case kI16: {
      int16_t v;
      return in.Read(&v) && integer(v);
    }
    case kU32: {
      uint32_t v;
      return in.Read(&v) && integer(v);
    }
    case kI32: {
      int32_t v;
      return in.Read(&v) && integer(v);
    }
    case kU64: {
      uint64_t v;
      if (!in.Read(&v)) return false;
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        *error = "a uint64 value above 2^63";
        return false;
      }
      return integer(v);
    }
    case kI64: {
      int64_t v;
      return in.Read(&v) && integer(v);
    }
    case kF32: {
      float v;
      if (!in.Read(&v)) return false;
      value->kind = GgufValue::kFloat;
      value->number = v;
      return true;
    }
    case kF64: {
      double v;
      if (!in.Read(&v)) return false;
      value->kind = GgufValue::kFloat;
      value->number = v;
      return true;
    }
    case kBool: {
      uint8_t v;
      if (!in.Read(&v)) return false;
      value->kind = GgufValue::kBool;
      value->boolean = v != 0;
      return true;
    }
    case kString:
      value->kind = GgufValue::kString;
      return in.ReadString(&value->text);
    default:
      *error = fmt::format("unknown value type {}", type);
      return false;
  }
}

bool ReadValue(Cursor& in, uint32_t type, GgufValue* value, std::string* error) {
  if (type != kArray) return ReadScalar(in, type, value, error);
  uint32_t element_type = 0;
  uint64_t count = 0;
  if (!in.Read(&element_type) || !in.Read(&count)) return false;
  if (element_type == kArray) {
    *error = "arrays of arrays are not supported";
    return false;
  }
  if (count > in.left()) return false;  // Every element takes at least one byte.
  value->kind = GgufValue::kArray;
  GgufValue element;
  for (uint64_t i = 0; i < count; ++i) {
    if (!ReadScalar(in, element_type, &element, error)) return false;
    if (i == 0) value->element_kind = element.kind;
    switch (element.kind) {
      case GgufValue::kInteger:
        value->integers.push_back(element.integer);
        break;
      case GgufValue::kBool:
        value->integers.push_back(element.boolean ? 1 : 0);
        break;
      case GgufValue::kFloat:
        value->numbers.push_back(element.number);
        break;
      case GgufValue::kString:
        value->texts.push_back(std::move(element.text));
        break;
      case GgufValue::kArray:
        break;
    }
  }
  if (count == 0)
    value->element_kind = element_type == kString                        ? GgufValue::kString
                          : element_type == kF32 || element_type == kF64 ? GgufValue::kFloat
                                                                         : GgufValue::kInteger;
  return true;
}

const char* KindName(GgufValue::Kind kind) {
  switch (kind) {
    case GgufValue::kInteger:
      return "an integer";
    case GgufValue::kFloat:
      return "a float";
    case GgufValue::kBool:
      return "a bool";
    case GgufValue::kString:
      return "a string";
    case GgufValue::kArray:
      break;
  }
  return "an array";
}

}  // namespace

int64_t GgufTensor::elements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<GgufSplitName> ParseGgufSplitName(const std::string& path) {
  // <prefix>-NNNNN-of-NNNNN.gguf
  constexpr std::string_view kSuffix = ".gguf";
  constexpr size_t kTail = 1 + 5 + 4 + 5;  // "-NNNNN-of-NNNNN"
  if (path.size() < kTail + kSuffix.size() + 1 || !path.ends_with(kSuffix)) return std::nullopt;
  const std::string_view tail =
      std::string_view(path).substr(path.size() - kSuffix.size() - kTail, kTail);
  auto digits = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-" || !digits(tail.substr(1, 5)) ||
      !digits(tail.substr(10, 5))) {
    return std::nullopt;
  }
  GgufSplitName name;
  name.prefix = path.substr(0, path.size() - kSuffix.size() - kTail);
  name.part = std::stoi(std::string(tail.substr(1, 5)));
  name.count = std::stoi(std::string(tail.substr(10, 5)));
  if (name.part < 1 || name.part > name.count) return std::nullopt;
  return name;
}

std::string GgufSplitPath(const std::string& prefix, int part, int count) {
  return fmt::format("{}-{:05d}-of-{:05d}.gguf", prefix, part, count);
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  auto file = OpenOne(path);
  if (!file.ok()) return file.status();
  SLUICE_RETURN_IF_ERROR((*file)->OpenLaterParts());
  return file;
}

std::vector<std::string> GgufFile::part_paths() const {
  std::vector<std::string> paths{path_};
  for (const auto& part : parts_) paths.push_back(part->path_);
  return paths;
}

Status GgufFile::OpenLaterParts() {
  const GgufValue* count_value = Find("split.count");
  if (count_value == nullptr) return Status::Ok();
  auto count = Integer("split.count");
  auto number = Integer("split.no", 0);
  if (!count.ok()) return count.status();
  if (!number.ok()) return number.status();
  if (*count < 1 || *count > 99999 || *number < 0 || *number >= *count) {
    return Invalid(path_, fmt::format("split.no {} of split.count {}", *number, *count));
  }
  if (*count == 1) return Status::Ok();
  const auto name = ParseGgufSplitName(path_);
  if (*number != 0) {
    return Status::InvalidArgument(fmt::format(
        "{}: part {} of a model split in {}: open its first part{}", path_, *number + 1, *count,
        name ? ", " + GgufSplitPath(name->prefix, 1, static_cast<int>(*count)) : ""));
  }
  if (!name || name->count != *count) {
    return Status::InvalidArgument(fmt::format(
        "{}: the first of {} parts of a split model, but not named as llama.cpp names them "
        "(<prefix>-00001-of-{:05d}.gguf), so its other parts cannot be found",
        path_, *count, *count));
  }
  auto expected_tensors = Integer("split.tensors.count", -1);
  if (!expected_tensors.ok()) return expected_tensors.status();
  for (int part = 2; part <= *count; ++part) {
    const std::string part_path = GgufSplitPath(name->prefix, part, static_cast<int>(*count));
    auto opened = OpenOne(part_path);
    if (!opened.ok()) {
      return Status(opened.status().code(),
                    fmt::format("{}: part {} of {} of the split model: {}", path_, part, *count,
                                opened.status().message()));
    }
    GgufFile& other = **opened;
    auto other_count = other.Integer("split.count", -1);
    auto other_number = other.Integer("split.no", -1);
    if (!other_count.ok() || !other_number.ok() || *other_count != *count ||
        *other_number != part - 1) {
      return Status::InvalidArgument(
          fmt::format("{}: its split.count/split.no say it is not part {} of {} of {}", part_path,
                      part, *count, path_));
    }
    for (GgufTensor& tensor : other.tensors_) {
      if (tensor_index_.count(tensor.name) != 0) {
        return Invalid(part_path, fmt::format("tensor '{}' is in another part too", tensor.name));
      }
      tensor_index_.emplace(tensor.name, tensors_.size());
      tensors_.push_back(tensor);  // Its data stays mapped by the part, kept below.
    }
    parts_.push_back(std::move(*opened));
  }
  if (*expected_tensors >= 0 && static_cast<size_t>(*expected_tensors) != tensors_.size()) {
    return Invalid(path_, fmt::format("split.tensors.count is {}, the parts hold {}",
                                      *expected_tensors, tensors_.size()));
  }
  return Status::Ok();
}

Result<std::unique_ptr<GgufFile>> GgufFile::OpenOne(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::NotFound(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    close(fd);
    return Status::Internal(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  const auto file_bytes = static_cast<size_t>(info.st_size);
  if (file_bytes < 24) {
    close(fd);
    return Invalid(path, fmt::format("{} bytes, shorter than GGUF's header", file_bytes));
  }
  void* mapping = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    return Status::Internal(fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_bytes_ = file_bytes;

  const auto* bytes = static_cast<const uint8_t*>(mapping);
  Cursor in(bytes, bytes + file_bytes);
  uint32_t magic = 0;
  uint64_t tensor_count = 0, kv_count = 0;
  in.Read(&magic);
  if (magic != kMagic) return Invalid(path, "the magic is not 'GGUF'");
  in.Read(&file->version_);
  if (file->version_ != 2 && file->version_ != 3) {
    return Invalid(path, fmt::format("version {} (2 and 3 are read)", file->version_));
  }
  in.Read(&tensor_count);
  in.Read(&kv_count);
  // Each key-value pair and tensor description takes well over 8 bytes.
  if (kv_count > file_bytes / 8 || tensor_count > file_bytes / 8) {
    return Invalid(path, fmt::format("{} metadata keys and {} tensors cannot fit in {} bytes",
                                     kv_count, tensor_count, file_bytes));
  }
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key, error;
    uint32_t type = 0;
    GgufValue value;
    if (!in.ReadString(&key) || !in.Read(&type) || !ReadValue(in, type, &value, &error)) {
      return Invalid(path, fmt::format("metadata entry {}{}{}: {}", i, key.empty() ? "" : " '",
                                       key.empty() ? "" : key + "'",
                                       error.empty() ? "runs past the end of the file" : error));
    }
    if (!file->metadata_.emplace(key, std::move(value)).second) {
      return Invalid(path, fmt::format("metadata key '{}' appears twice", key));
    }
  }
  int64_t alignment = 32;
  if (const GgufValue* value = file->Find("general.alignment"); value != nullptr) {
    if (value->kind != GgufValue::kInteger || value->integer <= 0 || value->integer > (1 << 20) ||
        (value->integer & (value->integer - 1)) != 0) {
      return Invalid(path, "general.alignment is not a power of two");
    }
    alignment = value->integer;
  }
  std::vector<size_t> offsets;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor tensor;
    uint32_t dims = 0;
    if (!in.ReadString(&tensor.name) || !in.Read(&dims)) {
      return Invalid(path, fmt::format("tensor description {} runs past the end of the file", i));
    }
    if (dims == 0 || dims > kMaxDims) {
      return Invalid(path, fmt::format("tensor '{}' has {} dimensions (1 to {})", tensor.name, dims,
                                       kMaxDims));
    }
    std::vector<int64_t> ne(dims);  // Innermost first, as ggml counts them.
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t n = 0;
      if (!in.Read(&n)) return Invalid(path, fmt::format("tensor '{}' is cut off", tensor.name));
      if (n == 0 || n > (uint64_t{1} << 40)) {
        return Invalid(path,
                       fmt::format("tensor '{}' has dimension {} of size {}", tensor.name, d, n));
      }
      ne[d] = static_cast<int64_t>(n);
    }
    uint64_t offset = 0;
    if (!in.Read(&tensor.type) || !in.Read(&offset)) {
      return Invalid(path, fmt::format("tensor '{}' is cut off", tensor.name));
    }
    int64_t block = 0, block_bytes = 0;
    if (!GgmlBlockLayout(tensor.type, &block, &block_bytes)) {
      return Status::InvalidArgument(fmt::format(
          "{}: tensor '{}' has type {}, which Sluice does not read (F32, F16, BF16, Q8_0, Q4_0, "
          "Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, IQ3_S, "
          "IQ2_XS, MXFP4)",
          path, tensor.name, GgmlTypeName(tensor.type)));
    }
    if (ne[0] % block != 0) {
      return Invalid(path,
                     fmt::format("tensor '{}' has rows of {} elements, not whole {} blocks of "
                                 "{}",
                                 tensor.name, ne[0], GgmlTypeName(tensor.type), block));
    }
    int64_t count = 1;
    for (int64_t n : ne) {
      if (count > (int64_t{1} << 40) / n) {
        return Invalid(path, fmt::format("tensor '{}' is too large", tensor.name));
      }
      count *= n;
    }
    tensor.shape.assign(ne.rbegin(), ne.rend());
    tensor.bytes = static_cast<size_t>(count / block * block_bytes);
    if (offset % static_cast<uint64_t>(alignment) != 0) {
      return Invalid(path, fmt::format("tensor '{}' at offset {} is not aligned to {}", tensor.name,
                                       offset, alignment));
    }
    if (file->tensor_index_.count(tensor.name) != 0) {
      return Invalid(path, fmt::format("tensor '{}' appears twice", tensor.name));
    }
    file->tensor_index_.emplace(tensor.name, file->tensors_.size());
    offsets.push_back(static_cast<size_t>(offset));
    file->tensors_.push_back(std::move(tensor));
  }
  const size_t header_end = in.offset();
  const size_t data_start = (header_end + static_cast<size_t>(alignment) - 1) /
                            static_cast<size_t>(alignment) * static_cast<size_t>(alignment);
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t i = 0; i < file->tensors_.size(); ++i) {
    GgufTensor& tensor = file->tensors_[i];
    if (data_start > file_bytes || offsets[i] > file_bytes - data_start ||
        tensor.bytes > file_bytes - data_start - offsets[i]) {
      return Invalid(path,
                     fmt::format("tensor '{}' ({} bytes at {}) runs past the end of the "
                                 "file ({} bytes): truncated?",
                                 tensor.name, tensor.bytes, data_start + offsets[i], file_bytes));
    }
    tensor.data = bytes + data_start + offsets[i];
    ranges.emplace_back(offsets[i], offsets[i] + tensor.bytes);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) {
      return Invalid(path, "two tensors' data overlap");
    }
  }
  return file;
}

GgufFile::~GgufFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? nullptr : &it->second;
}

namespace {

Status Missing(const std::string& path, std::string_view key) {
  return Status::InvalidArgument(fmt::format("{}: metadata key '{}' is missing", path, key));
}

Status WrongKind(const std::string& path, std::string_view key, const GgufValue& value,
                 const char* wanted) {
  return Status::InvalidArgument(
      fmt::format("{}: metadata key '{}' is {}, not {}", path, key, KindName(value.kind), wanted));
}

}  // namespace

Result<std::string> GgufFile::String(std::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return Missing(path_, key);
  if (value->kind != GgufValue::kString) return WrongKind(path_, key, *value, "a string");
  return value->text;
}

Result<int64_t> GgufFile::Integer(std::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return Missing(path_, key);
  if (value->kind != GgufValue::kInteger) return WrongKind(path_, key, *value, "an integer");
  return value->integer;
}

Result<double> GgufFile::Number(std::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return Missing(path_, key);
  if (value->kind == GgufValue::kInteger) return static_cast<double>(value->integer);
  if (value->kind != GgufValue::kFloat) return WrongKind(path_, key, *value, "a number");
  return value->number;
}

Result<int64_t> GgufFile::Integer(std::string_view key, int64_t fallback) const {
  if (Find(key) == nullptr) return fallback;
  return Integer(key);
}

Result<double> GgufFile::Number(std::string_view key, double fallback) const {
  if (Find(key) == nullptr) return fallback;
  return Number(key);
}

Result<bool> GgufFile::Bool(std::string_view key, bool fallback) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return fallback;
  if (value->kind != GgufValue::kBool) return WrongKind(path_, key, *value, "a bool");
  return value->boolean;
}

Result<std::string> GgufFile::String(std::string_view key, const std::string& fallback) const {
  if (Find(key) == nullptr) return fallback;
  return String(key);
}

Result<const std::vector<std::string>*> GgufFile::Strings(std::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return Missing(path_, key);
  if (value->kind != GgufValue::kArray || value->element_kind != GgufValue::kString) {
    return WrongKind(path_, key, *value, "an array of strings");
  }
  return &value->texts;
}

Result<const std::vector<int64_t>*> GgufFile::Integers(std::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return Missing(path_, key);
  if (value->kind != GgufValue::kArray || value->element_kind != GgufValue::kInteger) {
    return WrongKind(path_, key, *value, "an array of integers");
  }
  return &value->integers;
}

Result<const std::vector<double>*> GgufFile::Numbers(std::string_view key) const {
  const GgufValue* value = Find(key);
  if (value == nullptr) return Missing(path_, key);
  if (value->kind != GgufValue::kArray || value->element_kind != GgufValue::kFloat) {
    return WrongKind(path_, key, *value, "an array of floats");
  }
  return &value->numbers;
}

bool LooksLikeGguf(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  uint32_t magic = 0;
  in.read(reinterpret_cast<char*>(&magic), sizeof magic);
  return in && magic == kMagic;
}

}  // namespace sluice::llm
