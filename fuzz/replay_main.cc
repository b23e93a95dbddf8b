// Runs a fuzz target over files without libFuzzer, for compilers without it: every file named on
// the command line, and every file in each directory named. The tests use it to replay the seed
// corpora and the inputs that once crashed, so each finding stays a regression test everywhere.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

int RunFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 1;
  }
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // A copy the size of the input exactly, so the sanitizers catch reads past its end.
  std::vector<uint8_t> input(bytes.begin(), bytes.end());
  LLVMFuzzerTestOneInput(input.data(), input.size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  int inputs = 0;
  int failures = 0;
  for (int i = 1; i < argc; ++i) {
    fs::path arg = argv[i];
    std::vector<fs::path> files;
    if (fs::is_directory(arg)) {
      for (const auto& entry : fs::directory_iterator(arg)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(arg);
    }
    for (const fs::path& file : files) {
      failures += RunFile(file);
      ++inputs;
    }
  }
  std::printf("replayed %d input(s)\n", inputs);
  return failures == 0 && inputs > 0 ? 0 : 1;
}
