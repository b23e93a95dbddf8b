// `sluice serve SOURCE`: a file, a folder, or a model id in the local Hugging Face cache.
#include "llm/files/model_source.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <vector>

#include "llm/files/gguf.h"

namespace sluice::llm {
namespace {

namespace fs = std::filesystem;

std::string Lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

// A part of a Hugging Face id: letters, digits, '-', '_', '.', not starting with '.'.
bool IsIdPart(std::string_view part) {
  if (part.empty() || part.size() > 96 || part[0] == '.') return false;
  return std::all_of(part.begin(), part.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '-' || c == '_' || c == '.';
  });
}

// A GGUF file's served name: its stem, without a split model's "-00001-of-00003".
std::string NameOfFile(const fs::path& file) {
  if (auto split = ParseGgufSplitName(file.string())) return fs::path(split->prefix).filename();
  return file.stem().string();
}

// The snapshot a cached model's refs/main names, or its only snapshot.
Result<fs::path> Snapshot(const fs::path& model_dir, const std::string& id) {
  std::error_code ec;
  const fs::path snapshots = model_dir / "snapshots";
  std::ifstream ref(model_dir / "refs" / "main");
  std::string revision;
  if (ref && std::getline(ref, revision) && !revision.empty()) {
    const fs::path snapshot = snapshots / revision;
    if (fs::is_directory(snapshot, ec)) return snapshot;
    return Status::NotFound(
        fmt::format("model '{}': refs/main names revision {}, which is not in {}", id, revision,
                    snapshots.string()));
  }
  std::vector<fs::path> found;
  for (const auto& entry : fs::directory_iterator(snapshots, ec)) {
    if (entry.is_directory(ec)) found.push_back(entry.path());
  }
  if (found.size() == 1) return found.front();
  return Status::NotFound(fmt::format("model '{}': {} holds {} snapshots and no refs/main", id,
                                      snapshots.string(), found.size()));
}

// The GGUF files of a folder whose names contain `tag` (case-insensitive), split models once.
std::vector<fs::path> GgufFilesTagged(const fs::path& dir, const std::string& tag) {
  std::vector<fs::path> files;
  std::error_code ec;
  for (const auto& entry : fs::recursive_directory_iterator(dir, ec)) {
    const fs::path& path = entry.path();
    if (path.extension() != ".gguf" || !entry.is_regular_file(ec)) continue;
    if (auto split = ParseGgufSplitName(path.string()); split && split->part != 1) continue;
    if (Lower(path.filename().string()).find(Lower(tag)) == std::string::npos) continue;
    files.push_back(path);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

std::string HuggingFaceHubCache(const std::map<std::string, std::string>& env) {
  auto get = [&](const char* key) {
    auto it = env.find(key);
    return it == env.end() ? std::string() : it->second;
  };
  if (!get("HF_HUB_CACHE").empty()) return get("HF_HUB_CACHE");
  if (!get("HF_HOME").empty()) return (fs::path(get("HF_HOME")) / "hub").string();
  const std::string xdg = get("XDG_CACHE_HOME");
  const fs::path cache = !xdg.empty() ? fs::path(xdg) : fs::path(get("HOME")) / ".cache";
  return (cache / "huggingface" / "hub").string();
}

std::map<std::string, std::string> HubEnvironment() {
  std::map<std::string, std::string> env;
  for (const char* key : {"HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME"}) {
    if (const char* value = std::getenv(key)) env[key] = value;
  }
  return env;
}

Result<ModelSource> ResolveModelSource(const std::string& source,
                                       const std::map<std::string, std::string>& env) {
  std::error_code ec;
  const fs::path path(source);
  if (fs::is_regular_file(path, ec)) {
    if (!LooksLikeGguf(source)) {
      return Status::InvalidArgument(fmt::format(
          "'{}' is a file but not a GGUF model; serve a GGUF file, a model's folder or a "
          "Hugging Face model id",
          source));
    }
    return ModelSource{source, NameOfFile(path)};
  }
  if (fs::is_directory(path, ec)) {
    fs::path normal = path.lexically_normal();
    std::string name = normal.filename().string();
    if (name.empty()) name = normal.parent_path().filename().string();
    return ModelSource{source, name};
  }
  // A Hugging Face id: org/name, optionally :TAG for one GGUF file of the repository.
  std::string id = source, tag;
  if (const size_t colon = source.find(':'); colon != std::string::npos) {
    id = source.substr(0, colon);
    tag = source.substr(colon + 1);
  }
  const size_t slash = id.find('/');
  if (slash == std::string::npos || !IsIdPart(id.substr(0, slash)) ||
      !IsIdPart(id.substr(slash + 1)) || (source.find(':') != std::string::npos && tag.empty())) {
    return Status::NotFound(fmt::format(
        "'{}' is neither a file, a folder nor a Hugging Face model id (org/name[:TAG])", source));
  }
  const std::string hub = HuggingFaceHubCache(env);
  const fs::path model_dir =
      fs::path(hub) / ("models--" + id.substr(0, slash) + "--" + id.substr(slash + 1));
  if (!fs::is_directory(model_dir, ec)) {
    return Status::NotFound(fmt::format(
        "model '{}' is not in the Hugging Face cache ({} not found; the cache is HF_HUB_CACHE, "
        "else HF_HOME/hub, else ~/.cache/huggingface/hub). Sluice downloads nothing: fetch it "
        "first, e.g. `hf download {}`",
        id, model_dir.string(), id));
  }
  auto snapshot = Snapshot(model_dir, id);
  if (!snapshot.ok()) return snapshot.status();
  if (tag.empty()) return ModelSource{snapshot->string(), id};
  const std::vector<fs::path> files = GgufFilesTagged(*snapshot, tag);
  if (files.size() != 1) {
    std::vector<std::string> names;
    for (const fs::path& file : GgufFilesTagged(*snapshot, "")) {
      names.push_back(fs::relative(file, *snapshot, ec).string());
    }
    return Status::NotFound(fmt::format(
        "model '{}': {} GGUF files match '{}' in {} (its GGUF files: {})", id, files.size(), tag,
        snapshot->string(), names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "))));
  }
  return ModelSource{files.front().string(), source};
}

}  // namespace sluice::llm
