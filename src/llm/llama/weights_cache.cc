#include "llm/llama/weights_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace sluice::llm::llama {
namespace {

namespace fs = std::filesystem;

// The file: a header of kHeaderBytes, a table of kEntryBytes an entry, then each tensor's bytes
// from a multiple of kAlign.
//   header  magic (8 bytes), version (u32), entries (u32), identity (4 x u64), file bytes (u64)
//   entry   name (64 bytes, NUL-padded), type (u32), 0 (u32), rows, offset, bytes (3 x i64)
constexpr char kMagic[8] = {'S', 'L', 'U', 'I', 'C', 'E', 'W', 'C'};
constexpr int64_t kHeaderBytes = 64, kEntryBytes = 96, kNameBytes = 64, kAlign = 4096;

int64_t AlignUp(int64_t value) { return (value + kAlign - 1) / kAlign * kAlign; }

template <class T>
void Put(std::vector<uint8_t>& out, int64_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof(T));
}
template <class T>
T Get(const uint8_t* from) {
  T value;
  std::memcpy(&value, from, sizeof(T));
  return value;
}

// FNV-1a, 64 bits: the file name's digest of the GGUF file's path and identity.
uint64_t Fnv1a(std::string_view bytes, uint64_t hash = 14695981039346656037ull) {
  for (const char c : bytes) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 1099511628211ull;
  }
  return hash;
}

// Writes through a buffer of 2 MiB, so that every write() is 2 MiB at a 2 MiB offset (the
// last excepted): the page cache then holds the file in 2 MiB folios where the file system
// can, which the readers' mappings map as huge pages.
class StagedWriter {
 public:
  StagedWriter(int fd, std::string path) : fd_(fd), path_(std::move(path)), buffer_(kStage) {}
  Status Append(const void* data, int64_t bytes) {
    const auto* from = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      const int64_t take = std::min(bytes, kStage - used_);
      if (from != nullptr) {
        std::memcpy(buffer_.data() + used_, from, static_cast<size_t>(take));
        from += take;
      } else {
        std::memset(buffer_.data() + used_, 0, static_cast<size_t>(take));
      }
      used_ += take;
      bytes -= take;
      if (used_ == kStage) SLUICE_RETURN_IF_ERROR(Flush());
    }
    return Status::Ok();
  }
  Status Flush() {
    Status status = WriteAll(fd_, buffer_.data(), used_, path_);
    used_ = 0;
    return status;
  }

 private:
  static constexpr int64_t kStage = int64_t{2} << 20;
  static Status WriteAll(int fd, const void* data, int64_t bytes, const std::string& path);
  int fd_;
  std::string path_;
  std::vector<uint8_t> buffer_;
  int64_t used_ = 0;
};

Status StagedWriter::WriteAll(int fd, const void* data, int64_t bytes, const std::string& path) {
  const auto* from = static_cast<const uint8_t*>(data);
  while (bytes > 0) {
    const ssize_t written = write(fd, from, static_cast<size_t>(std::min<int64_t>(bytes, 1 << 30)));
    if (written < 0) {
      if (errno == EINTR) continue;
      return Status::Internal(fmt::format("{}: cannot write: {}", path, std::strerror(errno)));
    }
    from += written;
    bytes -= written;
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<WeightsCache>> WeightsCache::Open(const std::string& dir,
                                                         const GgufFile& file) {
  struct stat info {};
  if (stat(file.path().c_str(), &info) != 0) {
    return Status::InvalidArgument(
        fmt::format("{}: cannot stat: {}", file.path(), std::strerror(errno)));
  }
  std::unique_ptr<WeightsCache> cache(new WeightsCache());
  cache->identity_ = {static_cast<uint64_t>(info.st_size),
                      static_cast<uint64_t>(info.st_mtim.tv_sec) * 1000000000ull +
                          static_cast<uint64_t>(info.st_mtim.tv_nsec),
                      static_cast<uint64_t>(info.st_ino), static_cast<uint64_t>(info.st_dev)};
  std::error_code error;
  fs::path source = fs::weakly_canonical(file.path(), error);
  if (error) source = fs::absolute(file.path());
  uint64_t digest = Fnv1a(source.string());
  for (const uint64_t value : cache->identity_) {
    digest = Fnv1a(std::string_view(reinterpret_cast<const char*>(&value), sizeof(value)), digest);
  }
  // A split model's later parts: a changed part gives the cache another name.
  const std::vector<std::string> parts = file.part_paths();
  for (size_t i = 1; i < parts.size(); ++i) {
    struct stat part {};
    if (stat(parts[i].c_str(), &part) != 0) {
      return Status::InvalidArgument(
          fmt::format("{}: cannot stat: {}", parts[i], std::strerror(errno)));
    }
    for (const uint64_t value :
         {static_cast<uint64_t>(part.st_size), static_cast<uint64_t>(part.st_mtim.tv_sec),
          static_cast<uint64_t>(part.st_mtim.tv_nsec), static_cast<uint64_t>(part.st_ino)}) {
      digest =
          Fnv1a(std::string_view(reinterpret_cast<const char*>(&value), sizeof(value)), digest);
    }
  }
  digest = Fnv1a(fmt::format("v{}", kVersion), digest);
  const std::string folder = source.parent_path().filename().string();
  cache->path_ =
      (fs::path(dir) / fmt::format("{}{}{}-{:016x}.repacked", folder, folder.empty() ? "" : "-",
                                   source.stem().string(), digest))
          .string();
  cache->Map();
  return cache;
}

WeightsCache::~WeightsCache() = default;

bool WeightsCache::Map() {
  const int fd = open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat info {};
  if (fstat(fd, &info) != 0 || info.st_size < kHeaderBytes) {
    close(fd);
    return false;
  }
  const auto length = static_cast<size_t>(info.st_size);
  // At a 2 MiB boundary, so that each 2 MiB of the file lies on one where the kernel can map it
  // as a huge page (a tmpfs with huge=, a file system whose page cache holds 2 MiB folios).
  // Populated at once: start-up reads the file (from the page cache, where it was written or read
  // before) rather than the first requests faulting it in.
  constexpr size_t kHuge = size_t{2} << 20;
  void* area = mmap(nullptr, length + kHuge, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (area == MAP_FAILED) {
    close(fd);
    return false;
  }
  const auto start = reinterpret_cast<uintptr_t>(area);
  const uintptr_t aligned = (start + kHuge - 1) & ~(kHuge - 1);
  if (aligned > start) munmap(area, aligned - start);
  if (const size_t tail = start + kHuge - aligned; tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + length), tail);
  }
  void* mapping =
      mmap(reinterpret_cast<void*>(aligned), length, PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0);
  close(fd);
  if (mapping == MAP_FAILED) {
    munmap(reinterpret_cast<void*>(aligned), length);
    return false;
  }
  // Advised first, so that pages read in now come as 2 MiB folios where the kernel can.
  madvise(mapping, length, MADV_HUGEPAGE);
  madvise(mapping, length, MADV_POPULATE_READ);
  std::shared_ptr<void> owner(mapping, [length](void* p) { munmap(p, length); });
  const auto* base = static_cast<const uint8_t*>(mapping);
  const auto file_bytes = static_cast<int64_t>(length);
  if (std::memcmp(base, kMagic, sizeof(kMagic)) != 0 || Get<uint32_t>(base + 8) != kVersion ||
      Get<uint64_t>(base + 48) != static_cast<uint64_t>(file_bytes)) {
    return false;
  }
  for (size_t i = 0; i < identity_.size(); ++i) {
    if (Get<uint64_t>(base + 16 + 8 * i) != identity_[i]) return false;
  }
  const int64_t count = Get<uint32_t>(base + 12);
  if (kHeaderBytes + count * kEntryBytes > file_bytes) return false;
  std::vector<Entry> entries;
  for (int64_t i = 0; i < count; ++i) {
    const uint8_t* at = base + kHeaderBytes + i * kEntryBytes;
    Entry entry;
    entry.name.assign(reinterpret_cast<const char*>(at),
                      strnlen(reinterpret_cast<const char*>(at), static_cast<size_t>(kNameBytes)));
    entry.type = Get<uint32_t>(at + 64);
    entry.rows = Get<int64_t>(at + 72);
    entry.offset = Get<int64_t>(at + 80);
    entry.bytes = Get<int64_t>(at + 88);
    if (entry.offset % kAlign != 0 || entry.offset < kHeaderBytes || entry.bytes < 0 ||
        entry.offset > file_bytes || entry.bytes > file_bytes - entry.offset) {
      return false;
    }
    entries.push_back(std::move(entry));
  }
  entries_ = std::move(entries);
  base_ = base;
  owner_ = std::move(owner);
  return true;
}

const uint8_t* WeightsCache::Find(std::string_view name, uint32_t type, int64_t rows,
                                  int64_t bytes) const {
  if (base_ == nullptr) return nullptr;
  for (const Entry& entry : entries_) {
    if (entry.name == name) {
      return entry.type == type && entry.rows == rows && entry.bytes == bytes ? base_ + entry.offset
                                                                              : nullptr;
    }
  }
  return nullptr;
}

Status WeightsCache::Write(const std::vector<Tensor>& tensors) {
  const fs::path target(path_);
  std::error_code error;
  fs::create_directories(target.parent_path(), error);
  if (error) {
    return Status::Internal(fmt::format("{}: cannot create the folder: {}",
                                        target.parent_path().string(), error.message()));
  }
  const int64_t table = kHeaderBytes + static_cast<int64_t>(tensors.size()) * kEntryBytes;
  std::vector<uint8_t> head(static_cast<size_t>(AlignUp(table)), 0);
  int64_t offset = AlignUp(table);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& tensor = tensors[i];
    if (tensor.name.size() >= static_cast<size_t>(kNameBytes)) {
      return Status::InvalidArgument(fmt::format("{}: tensor name '{}' is longer than {} bytes",
                                                 path_, tensor.name, kNameBytes - 1));
    }
    const int64_t at = kHeaderBytes + static_cast<int64_t>(i) * kEntryBytes;
    std::memcpy(head.data() + at, tensor.name.data(), tensor.name.size());
    Put<uint32_t>(head, at + 64, tensor.type);
    Put<int64_t>(head, at + 72, tensor.rows);
    Put<int64_t>(head, at + 80, offset);
    Put<int64_t>(head, at + 88, tensor.bytes);
    offset = AlignUp(offset + tensor.bytes);
  }
  std::memcpy(head.data(), kMagic, sizeof(kMagic));
  Put<uint32_t>(head, 8, kVersion);
  Put<uint32_t>(head, 12, static_cast<uint32_t>(tensors.size()));
  for (size_t i = 0; i < identity_.size(); ++i) {
    Put<uint64_t>(head, 16 + 8 * static_cast<int64_t>(i), identity_[i]);
  }
  Put<uint64_t>(head, 48, static_cast<uint64_t>(offset));

  const std::string temporary = fmt::format("{}.tmp.{}", path_, getpid());
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::Internal(fmt::format("{}: cannot create: {}", temporary, std::strerror(errno)));
  }
  StagedWriter writer(fd, temporary);
  Status status = writer.Append(head.data(), static_cast<int64_t>(head.size()));
  for (const Tensor& tensor : tensors) {
    if (!status.ok()) break;
    status = writer.Append(tensor.data, tensor.bytes);
    if (status.ok()) status = writer.Append(nullptr, AlignUp(tensor.bytes) - tensor.bytes);
  }
  if (status.ok()) status = writer.Flush();
  if (close(fd) != 0 && status.ok()) {
    status = Status::Internal(fmt::format("{}: cannot write: {}", temporary, std::strerror(errno)));
  }
  if (status.ok() && rename(temporary.c_str(), path_.c_str()) != 0) {
    status = Status::Internal(
        fmt::format("{}: cannot rename to {}: {}", temporary, path_, std::strerror(errno)));
  }
  if (!status.ok()) {
    unlink(temporary.c_str());
    return status;
  }
  base_ = nullptr;
  owner_.reset();
  entries_.clear();
  if (!Map()) return Status::Internal(fmt::format("{}: written but not readable", path_));
  return Status::Ok();
}

}  // namespace sluice::llm::llama
