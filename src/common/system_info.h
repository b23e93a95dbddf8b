// Facts about the machine and the build, for result files.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace sluice {

// "Intel(R) Xeon(R) ..." from /proc/cpuinfo, or "unknown".
std::string CpuModelName();
// Whether /proc/cpuinfo lists an instruction-set flag, e.g. "avx512_bf16", "amx_bf16".
bool CpuHasFlag(const std::string& flag);
// Whether the CPU computes bf16 natively (AVX-512 BF16 or AMX); elsewhere libtorch emulates it
// in fp32, several times slower than fp32 itself.
bool CpuHasNativeBf16();
// Bytes the process could still take: the kernel's MemAvailable, or less where its cgroup's
// memory.max leaves less room (a container's limit); nullopt where neither can be read.
std::optional<int64_t> AvailableMemoryBytes();
// The parts, from the files' texts: /proc/meminfo's MemAvailable; a cgroup v2 memory.max
// ("max": no limit) less memory.current.
std::optional<int64_t> MemAvailableOf(const std::string& meminfo);
std::optional<int64_t> CgroupRoomOf(const std::string& memory_max, const std::string& current);
// Logical cores the process may use.
int CoreCount();
// The git commit of the working directory's checkout ("abc1234", "-dirty" appended when there
// are uncommitted changes), or "unknown" outside a checkout.
std::string GitCommit();
// Local time as "2026-11-21T16:30:05".
std::string LocalTimestamp();
// Names the calling thread (at most 15 bytes kept), as `top -H`, `ps -L` and
// /proc/PID/task/TID/comm show it.
void NameThisThread(const char* name);

}  // namespace sluice
