#include "llm/files/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <simdjson.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <utility>

namespace sluice::llm {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // The format's own limit.

Status Invalid(const std::string& path, const std::string& what) {
  return Status::InvalidArgument(fmt::format("{}: not a valid safetensors file: {}", path, what));
}

}  // namespace

size_t SafetensorsFile::DtypeSize(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL") return 1;
  return 0;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::NotFound(fmt::format("{}: cannot open: {}", path, std::strerror(errno)));
  }
  struct stat info {};
  if (fstat(fd, &info) != 0) {
    close(fd);
    return Status::Internal(fmt::format("{}: cannot stat: {}", path, std::strerror(errno)));
  }
  const size_t file_bytes = static_cast<size_t>(info.st_size);
  if (file_bytes < 8) {
    close(fd);
    return Invalid(path, "shorter than its 8-byte header length");
  }
  void* mapping = mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    return Status::Internal(fmt::format("{}: cannot map: {}", path, std::strerror(errno)));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->mapping_bytes_ = file_bytes;

  const auto* bytes = static_cast<const uint8_t*>(mapping);
  uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, bytes, 8);  // Little-endian, as is every machine Sluice runs on.
  if (header_bytes > kMaxHeaderBytes || header_bytes > file_bytes - 8) {
    return Invalid(path, fmt::format("header length {} exceeds the file", header_bytes));
  }
  const size_t data_offset = 8 + header_bytes;
  const size_t data_bytes = file_bytes - data_offset;

  simdjson::dom::parser parser;
  simdjson::padded_string header(reinterpret_cast<const char*>(bytes + 8), header_bytes);
  simdjson::dom::object root;
  if (parser.parse(header).get(root) != simdjson::SUCCESS) {
    return Invalid(path, "the header is not a JSON object");
  }
  std::vector<std::pair<size_t, size_t>> ranges;
  for (auto field : root) {
    const std::string name(field.key);
    if (name == "__metadata__") {
      simdjson::dom::object metadata;
      if (field.value.get(metadata) != simdjson::SUCCESS) return Invalid(path, "bad __metadata__");
      for (auto item : metadata) {
        std::string_view value;
        if (item.value.get(value) == simdjson::SUCCESS) {
          file->metadata_[std::string(item.key)] = std::string(value);
        }
      }
      continue;
    }
    SafetensorsEntry entry;
    std::string_view dtype;
    simdjson::dom::array shape, offsets;
    if (field.value["dtype"].get(dtype) != simdjson::SUCCESS ||
        field.value["shape"].get(shape) != simdjson::SUCCESS ||
        field.value["data_offsets"].get(offsets) != simdjson::SUCCESS || offsets.size() != 2) {
      return Invalid(path, fmt::format("tensor '{}' lacks dtype, shape or data_offsets", name));
    }
    entry.dtype = std::string(dtype);
    const size_t element_bytes = DtypeSize(entry.dtype);
    if (element_bytes == 0) {
      return Invalid(path, fmt::format("tensor '{}' has unknown dtype {}", name, entry.dtype));
    }
    uint64_t elements = 1;
    for (auto dim : shape) {
      uint64_t value = 0;
      if (dim.get(value) != simdjson::SUCCESS || value > (1ull << 40)) {
        return Invalid(path, fmt::format("tensor '{}' has a bad shape", name));
      }
      entry.shape.push_back(static_cast<int64_t>(value));
      elements *= value;
      if (elements > (1ull << 40)) return Invalid(path, fmt::format("tensor '{}' too large", name));
    }
    uint64_t begin = 0, end = 0;
    if (offsets.at(0).get(begin) != simdjson::SUCCESS ||
        offsets.at(1).get(end) != simdjson::SUCCESS || begin > end || end > data_bytes) {
      return Invalid(path, fmt::format("tensor '{}' lies outside the data", name));
    }
    if (end - begin != elements * element_bytes) {
      return Invalid(path, fmt::format("tensor '{}' holds {} bytes, its shape needs {}", name,
                                       end - begin, elements * element_bytes));
    }
    entry.data = bytes + data_offset + begin;
    entry.bytes = end - begin;
    if (entry.bytes > 0) ranges.emplace_back(begin, end);
    file->entries_.emplace(name, std::move(entry));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].first < ranges[i - 1].second) return Invalid(path, "tensor data overlaps");
  }
  return file;
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::OpenCheckpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single, ec) || !fs::exists(index, ec)) return Open(single.string());
  simdjson::dom::parser parser;
  simdjson::dom::element root;
  simdjson::dom::object weight_map;
  if (parser.load(index.string()).get(root) != simdjson::SUCCESS ||
      root["weight_map"].get(weight_map) != simdjson::SUCCESS) {
    return Status::InvalidArgument(
        fmt::format("{}: not a checkpoint index (no weight_map object)", index.string()));
  }
  std::unique_ptr<SafetensorsFile> checkpoint(new SafetensorsFile());
  checkpoint->path_ = index.string();
  std::map<std::string, size_t> shard_of_file;
  for (auto [tensor, value] : weight_map) {
    std::string_view file_name;
    if (value.get(file_name) != simdjson::SUCCESS || file_name.empty() ||
        file_name.find('/') != std::string_view::npos || file_name.starts_with(".")) {
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' maps to a bad file name", index.string(), tensor));
    }
    auto [it, added] = shard_of_file.emplace(std::string(file_name), checkpoint->shards_.size());
    if (added) {
      const std::string shard_path = (fs::path(dir) / it->first).string();
      auto shard = Open(shard_path);
      if (!shard.ok()) {
        return Status(shard.status().code(),
                      fmt::format("{}: shard {} of the checkpoint: {}", index.string(), it->first,
                                  shard.status().message()));
      }
      checkpoint->shards_.push_back(std::move(*shard));
    }
    const SafetensorsFile& shard = *checkpoint->shards_[it->second];
    const SafetensorsEntry* entry = shard.Find(std::string(tensor));
    if (entry == nullptr) {
      return Status::InvalidArgument(
          fmt::format("{}: tensor '{}' is not in {}, where the index "
                      "puts it",
                      index.string(), tensor, shard.path()));
    }
    checkpoint->entries_.emplace(std::string(tensor), *entry);  // Mapped by the shard, kept.
  }
  if (checkpoint->shards_.empty()) {
    return Status::InvalidArgument(fmt::format("{}: its weight_map is empty", index.string()));
  }
  checkpoint->metadata_ = checkpoint->shards_.front()->metadata_;
  return checkpoint;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_bytes_);
}

const SafetensorsEntry* SafetensorsFile::Find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

}  // namespace sluice::llm
