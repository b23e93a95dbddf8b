#include "llm/kv_disk_store.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

namespace sluice::llm {

namespace {

namespace fs = std::filesystem;

constexpr char kMagic[8] = {'S', 'L', 'K', 'V', 'B', 'L', 'K', '1'};

struct FileHeader {
  char magic[8];
  uint64_t hash;
  uint64_t parent;
  uint32_t tokens;
  uint32_t reserved;
  uint64_t data_bytes;
  uint64_t checksum;  // Over the tokens' bytes, then the data's.
};
static_assert(sizeof(FileHeader) == 48);

// A 64-bit hash of `size` bytes continuing `h`: 8 bytes a multiply-xorshift round.
uint64_t HashBytes(uint64_t h, const void* bytes, size_t size) {
  const auto* p = static_cast<const unsigned char*>(bytes);
  auto mix = [&h](uint64_t word) {
    h ^= word + 0x9e3779b97f4a7c15ull;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 29;
  };
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    mix(word);
  }
  uint64_t tail = size;
  for (; i < size; ++i) tail = (tail << 8) | p[i];
  mix(tail);
  h ^= h >> 31;
  return h;
}

uint64_t Checksum(const std::vector<int32_t>& tokens, const std::string& data) {
  return HashBytes(HashBytes(0x5eed, tokens.data(), tokens.size() * sizeof(int32_t)), data.data(),
                   data.size());
}

std::string Hex(uint64_t value) { return fmt::format("{:016x}", value); }

}  // namespace

KvDiskStore::KvDiskStore(std::string folder, int64_t max_bytes)
    : folder_(std::move(folder)), max_bytes_(max_bytes) {}

Result<std::shared_ptr<KvDiskStore>> KvDiskStore::Open(const std::string& dir,
                                                       const std::string& layout,
                                                       int64_t max_bytes) {
  const std::string folder =
      (fs::path(dir) / Hex(HashBytes(0x1a7, layout.data(), layout.size()))).string();
  std::error_code ec;
  fs::create_directories(folder, ec);
  if (ec || !fs::is_directory(folder, ec)) {
    return Status::InvalidArgument(
        fmt::format("kv_cache_disk: cannot make the folder '{}': {}", folder, ec.message()));
  }
  {
    std::ofstream note(fs::path(folder) / "layout.txt", std::ios::trunc);
    note << layout << "\n";
    if (!note) {
      return Status::InvalidArgument(
          fmt::format("kv_cache_disk: cannot write in '{}'", folder));
    }
  }
  std::shared_ptr<KvDiskStore> store(new KvDiskStore(folder, max_bytes));
  store->Index();
  store->writer_ = std::thread([s = store.get()] { s->Run(); });
  return store;
}

KvDiskStore::~KvDiskStore() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  if (writer_.joinable()) writer_.join();
}

std::string KvDiskStore::PathOf(uint64_t hash) const {
  return (fs::path(folder_) / (Hex(hash) + ".kv")).string();
}

void KvDiskStore::Index() {
  struct Found {
    fs::file_time_type time;
    uint64_t hash;
    int64_t size;
  };
  std::vector<Found> found;
  std::error_code ec;
  int64_t dropped = 0;
  for (const auto& entry : fs::directory_iterator(folder_, ec)) {
    const fs::path path = entry.path();
    const std::string name = path.filename().string();
    if (name.find(".kv.tmp") != std::string::npos) {  // A write cut short.
      fs::remove(path, ec);
      continue;
    }
    if (path.extension() != ".kv") continue;
    FileHeader header{};
    std::ifstream in(path, std::ios::binary);
    const int64_t size = static_cast<int64_t>(entry.file_size(ec));
    const bool read = static_cast<bool>(in.read(reinterpret_cast<char*>(&header), sizeof(header)));
    if (!read || std::memcmp(header.magic, kMagic, 8) != 0 ||
        size != static_cast<int64_t>(sizeof(header) + header.tokens * sizeof(int32_t) +
                                     header.data_bytes) ||
        name != Hex(header.hash) + ".kv") {
      fs::remove(path, ec);
      ++dropped;
      continue;
    }
    found.push_back({entry.last_write_time(ec), header.hash, size});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.time < b.time; });
  MutexLock lock(mu_);
  discarded_ += dropped;
  for (const Found& f : found) {
    Entry& e = index_[f.hash];
    e.size = f.size;
    e.lru = lru_.insert(lru_.end(), f.hash);
    bytes_ += f.size;
  }
  Trim();
  if (dropped > 0) spdlog::warn("kv_cache_disk: {} damaged file(s) deleted in {}", dropped, folder_);
}

bool KvDiskStore::Contains(uint64_t hash) const {
  MutexLock lock(mu_);
  return index_.count(hash) > 0;
}

std::optional<DiskBlock> KvDiskStore::Get(uint64_t hash) {
  {
    MutexLock lock(mu_);
    if (index_.count(hash) == 0) return std::nullopt;
  }
  const std::string path = PathOf(hash);
  std::ifstream in(path, std::ios::binary);
  FileHeader header{};
  DiskBlock block;
  bool good = static_cast<bool>(in.read(reinterpret_cast<char*>(&header), sizeof(header))) &&
              std::memcmp(header.magic, kMagic, 8) == 0 && header.hash == hash &&
              header.tokens <= (1u << 16) && header.data_bytes <= (uint64_t{1} << 34);
  std::string data;
  if (good) {
    block.parent = header.parent;
    block.tokens.resize(header.tokens);
    data.resize(header.data_bytes);
    good = static_cast<bool>(in.read(reinterpret_cast<char*>(block.tokens.data()),
                                     static_cast<std::streamsize>(header.tokens * 4))) &&
           static_cast<bool>(in.read(data.data(), static_cast<std::streamsize>(data.size()))) &&
           in.peek() == std::char_traits<char>::eof() &&
           Checksum(block.tokens, data) == header.checksum;
  }
  MutexLock lock(mu_);
  auto it = index_.find(hash);
  if (!good) {
    spdlog::warn("kv_cache_disk: {} is damaged; deleted", path);
    if (it != index_.end()) {
      Forget(hash);
    } else {
      std::error_code ec;
      fs::remove(path, ec);
    }
    ++discarded_;
    return std::nullopt;
  }
  if (it != index_.end()) lru_.splice(lru_.end(), lru_, it->second.lru);
  ++hits_;
  // Recency outlives the process through the file's time.
  utimensat(AT_FDCWD, path.c_str(), nullptr, 0);
  block.data = std::make_shared<const std::string>(std::move(data));
  return block;
}

void KvDiskStore::Put(uint64_t hash, uint64_t parent, std::vector<int32_t> tokens,
                      std::string data) {
  {
    MutexLock lock(mu_);
    if (stopping_ || index_.count(hash) > 0 || queued_.count(hash) > 0 ||
        queue_.size() >= kMaxQueue) {
      return;
    }
    queued_.emplace(hash, true);
    queue_.push_back(Pending{hash, parent, std::move(tokens), std::move(data)});
  }
  wake_.Signal();
}

void KvDiskStore::Flush() {
  MutexLock lock(mu_);
  while (!queue_.empty() || writing_) written_.Wait(lock);
}

void KvDiskStore::Run() {
  for (;;) {
    Pending block;
    {
      MutexLock lock(mu_);
      while (queue_.empty() && !stopping_) wake_.Wait(lock);
      if (queue_.empty()) return;  // Stopping, with everything written.
      block = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
    }
    const bool ok = Write(block);
    const int64_t size = static_cast<int64_t>(sizeof(FileHeader) +
                                              block.tokens.size() * sizeof(int32_t) +
                                              block.data.size());
    {
      MutexLock lock(mu_);
      writing_ = false;
      queued_.erase(block.hash);
      if (ok && index_.count(block.hash) == 0) {
        Entry& e = index_[block.hash];
        e.size = size;
        e.lru = lru_.insert(lru_.end(), block.hash);
        bytes_ += size;
        Trim();
      }
    }
    written_.SignalAll();
  }
}

bool KvDiskStore::Write(const Pending& block) {
  FileHeader header{};
  std::memcpy(header.magic, kMagic, 8);
  header.hash = block.hash;
  header.parent = block.parent;
  header.tokens = static_cast<uint32_t>(block.tokens.size());
  header.data_bytes = block.data.size();
  header.checksum = Checksum(block.tokens, block.data);
  const std::string path = PathOf(block.hash);
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(&header), sizeof(header));
    out.write(reinterpret_cast<const char*>(block.tokens.data()),
              static_cast<std::streamsize>(block.tokens.size() * sizeof(int32_t)));
    out.write(block.data.data(), static_cast<std::streamsize>(block.data.size()));
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(temporary, ec);
      spdlog::warn("kv_cache_disk: cannot write {} (the disk full?)", temporary);
      return false;
    }
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) {
    fs::remove(temporary, ec);
    return false;
  }
  return true;
}

void KvDiskStore::Forget(uint64_t hash) {
  auto it = index_.find(hash);
  if (it == index_.end()) return;
  std::error_code ec;
  fs::remove(PathOf(hash), ec);
  bytes_ -= it->second.size;
  lru_.erase(it->second.lru);
  index_.erase(it);
}

void KvDiskStore::Trim() {
  while (bytes_ > max_bytes_ && !lru_.empty()) Forget(lru_.front());
}

int64_t KvDiskStore::bytes() const {
  MutexLock lock(mu_);
  return bytes_;
}

int64_t KvDiskStore::blocks() const {
  MutexLock lock(mu_);
  return static_cast<int64_t>(index_.size());
}

int64_t KvDiskStore::hits() const {
  MutexLock lock(mu_);
  return hits_;
}

int64_t KvDiskStore::discarded() const {
  MutexLock lock(mu_);
  return discarded_;
}

std::string KvDiskStore::FilesDigest(const std::vector<std::string>& files) {
  constexpr int64_t kWindow = 64 << 10;
  constexpr int kWindows = 64;
  uint64_t h = 0xd16e57;
  std::string window(static_cast<size_t>(kWindow), '\0');
  for (const std::string& file : files) {
    std::error_code ec;
    const auto size = static_cast<int64_t>(fs::file_size(file, ec));
    h = HashBytes(h, &size, sizeof(size));
    std::ifstream in(file, std::ios::binary);
    for (int w = 0; w < kWindows && size > 0; ++w) {
      const int64_t at = size <= kWindow ? 0 : (size - kWindow) * w / (kWindows - 1);
      in.clear();
      in.seekg(at);
      in.read(window.data(), kWindow);
      h = HashBytes(h, window.data(), static_cast<size_t>(in.gcount()));
      if (size <= kWindow) break;
    }
  }
  return Hex(h);
}

}  // namespace sluice::llm
