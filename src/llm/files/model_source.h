// What `sluice serve SOURCE` points at, as people name models: a GGUF file (a split model's first
// part), a model's folder (Hugging Face layout or a GGUF file inside), or a Hugging Face model id
// ("Qwen/Qwen2.5-0.5B-Instruct", optionally ":Q4_K_M" to pick one of a GGUF repository's files)
// found in the local Hugging Face cache, as vLLM and llama.cpp's -hf find them. Nothing is
// downloaded: a model that is not in the cache is an error naming where it was looked for.
#pragma once

#include <map>
#include <string>

#include "sluice/status.h"

namespace sluice::llm {

struct ModelSource {
  std::string path;  // A GGUF file, or a model's folder.
  std::string name;  // The name it is served under (vLLM's: the id as given; a file's stem).
};

// The Hugging Face cache's hub folder from the environment (`env`: HF_HUB_CACHE, HF_HOME,
// XDG_CACHE_HOME, HOME), as huggingface_hub resolves it.
std::string HuggingFaceHubCache(const std::map<std::string, std::string>& env);

// Resolves SOURCE. `env` as above (the process's environment in production).
Result<ModelSource> ResolveModelSource(const std::string& source,
                                       const std::map<std::string, std::string>& env);

// The process's environment variables that HuggingFaceHubCache reads.
std::map<std::string, std::string> HubEnvironment();

}  // namespace sluice::llm
