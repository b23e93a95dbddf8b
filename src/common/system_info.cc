// Machine and build facts for run.json.
#include "common/system_info.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <ctime>
#include <fstream>
#include <iterator>
#include <thread>

namespace sluice {

namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

std::optional<int64_t> MemAvailableOf(const std::string& meminfo) {
  const size_t at = meminfo.find("MemAvailable:");
  if (at == std::string::npos) return std::nullopt;
  long long kib = 0;
  if (sscanf(meminfo.c_str() + at, "MemAvailable: %lld kB", &kib) != 1) return std::nullopt;
  return static_cast<int64_t>(kib) * 1024;
}

std::optional<int64_t> CgroupRoomOf(const std::string& memory_max, const std::string& current) {
  long long limit = 0, used = 0;
  if (memory_max.starts_with("max") || sscanf(memory_max.c_str(), "%lld", &limit) != 1 ||
      sscanf(current.c_str(), "%lld", &used) != 1) {
    return std::nullopt;
  }
  return std::max<int64_t>(0, static_cast<int64_t>(limit) - static_cast<int64_t>(used));
}

std::optional<int64_t> AvailableMemoryBytes() {
  std::optional<int64_t> available = MemAvailableOf(ReadWhole("/proc/meminfo"));
  // The process's cgroup (v2: one line "0::/PATH") under the unified hierarchy's mount.
  const std::string cgroup = ReadWhole("/proc/self/cgroup");
  const size_t at = cgroup.find("0::");
  if (at != std::string::npos) {
    std::string path = cgroup.substr(at + 3);
    path = path.substr(0, path.find('\n'));
    const std::string dir = "/sys/fs/cgroup" + (path == "/" ? std::string() : path);
    const std::optional<int64_t> room =
        CgroupRoomOf(ReadWhole(dir + "/memory.max"), ReadWhole(dir + "/memory.current"));
    if (room && (!available || *room < *available)) available = room;
  }
  return available;
}
namespace {

// First line of a shell command's output, or "" when it fails.
std::string FirstLineOf(const char* command) {
  FILE* pipe = popen(command, "r");
  if (pipe == nullptr) return "";
  std::array<char, 256> buffer{};
  std::string line;
  if (fgets(buffer.data(), buffer.size(), pipe) != nullptr) line = buffer.data();
  int rc = pclose(pipe);
  if (rc != 0) return "";
  while (!line.empty() && (line.back() == '\n' || line.back() == '\r')) line.pop_back();
  return line;
}

}  // namespace

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

bool CpuHasFlag(const std::string& flag) {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    return (line + " ").find(" " + flag + " ") != std::string::npos;
  }
  return false;
}

bool CpuHasNativeBf16() { return CpuHasFlag("avx512_bf16") || CpuHasFlag("amx_bf16"); }

int CoreCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string GitCommit() {
  std::string commit = FirstLineOf("git rev-parse --short=12 HEAD 2>/dev/null");
  if (commit.empty()) return "unknown";
  std::string dirty =
      FirstLineOf("git status --porcelain --untracked-files=no 2>/dev/null | head -1");
  return dirty.empty() ? commit : commit + "-dirty";
}

std::string LocalTimestamp() {
  std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm local{};
  localtime_r(&now, &local);
  std::array<char, 32> text{};
  std::strftime(text.data(), text.size(), "%Y-%m-%dT%H:%M:%S", &local);
  return text.data();
}

void NameThisThread(const char* name) {
  char kept[16] = {};
  snprintf(kept, sizeof(kept), "%s", name);
  pthread_setname_np(pthread_self(), kept);
}

}  // namespace sluice
