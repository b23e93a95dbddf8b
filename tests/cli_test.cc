// Black-box tests of the sluice binary: bench and sweep on the tiny test models.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace {

using ::testing::HasSubstr;

const std::filesystem::path kModels = SLUICE_TEST_MODELS;

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together.
};

CommandResult RunSluice(const std::string& args) {
  std::string command = std::string(SLUICE_BINARY) + " " + args + " 2>&1";
  CommandResult result;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return result;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0)
    result.output.append(buffer.data(), n);
  int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

std::string ReadFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    results_ = std::filesystem::temp_directory_path() /
               ("sluice_cli_test_" + std::to_string(::getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override { std::filesystem::remove_all(results_); }
  // The only run directory under results_.
  std::filesystem::path RunDir() {
    std::vector<std::filesystem::path> dirs;
    for (const auto& e : std::filesystem::directory_iterator(results_)) dirs.push_back(e.path());
    EXPECT_EQ(dirs.size(), 1u);
    return dirs.empty() ? results_ : dirs[0];
  }
  std::filesystem::path results_;
};

TEST_F(CliTest, InProcessBenchPrintsTheSeedReportAndWritesResults) {
  CommandResult r = RunSluice("bench --in-process --model-dir " + (kModels / "tiny_cnn").string() +
                              " --batch-size 4 --num_iters 12 --num_workers 2 --threads 1"
                              " --results-dir " +
                              results_.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const char* line : {"Model load time:", "Compile/optimise time:", "Warmup latency:",
                           "Average latency (exclude warmup):", "Max latency:", "Min latency:",
                           "p50 / p90 / p95 / p99", "Throughput (exclude warmup):",
                           "Average CPU utilization:", "Average GPU utilization: n/a"}) {
    EXPECT_THAT(r.output, HasSubstr(line));
  }
  EXPECT_THAT(r.output, HasSubstr("Requests (exclude warmup): 12 ok, 0 failed"));
  std::filesystem::path dir = RunDir();
  EXPECT_THAT(dir.filename().string(), HasSubstr("bench-tiny_cnn"));
  std::string samples = ReadFile(dir / "samples.csv");
  EXPECT_EQ(std::count(samples.begin(), samples.end(), '\n'), 14);  // Header + 13 requests.
  EXPECT_THAT(ReadFile(dir / "run.json"), HasSubstr("\"precision\":\"fp32\""));
  EXPECT_THAT(ReadFile(dir / "summary.json"), HasSubstr("\"ok_requests\":12"));
}

TEST_F(CliTest, CompareCeilingReportsTheRatioPerRound) {
  CommandResult r = RunSluice("bench --in-process --model-dir " + (kModels / "tiny_cnn").string() +
                              " --batch-size 4 --iters 10 --compare-ceiling --rounds 2"
                              " --results-dir " +
                              results_.string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("round 2: engine ceiling"));
  EXPECT_THAT(r.output, HasSubstr("pipeline/ceiling"));
  EXPECT_THAT(ReadFile(RunDir() / "ceiling.json"), HasSubstr("\"median_ratio\":"));
}

TEST_F(CliTest, SweepWritesSummaryAndPlots) {
  std::filesystem::create_directories(results_);
  std::ofstream(results_ / "grid.yaml")
      << "batch_sizes: [1, 4]\nprecisions: [fp32]\niterations: 3\n";
  CommandResult r = RunSluice("sweep " + (results_ / "grid.yaml").string() +
                              " --model-repository " + kModels.string() +
                              " --model tiny_cnn --results-dir " + (results_ / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("samples/s"));
  EXPECT_THAT(r.output, HasSubstr("throughput_vs_batch_size.svg"));
  std::filesystem::path dir;
  for (const auto& e : std::filesystem::directory_iterator(results_ / "out")) dir = e.path();
  std::string csv = ReadFile(dir / "summary.csv");
  // Header + 2 sizes x torchscript with and without freeze (tiny_cnn has no package).
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 5);
  EXPECT_TRUE(std::filesystem::exists(dir / "latency_vs_batch_size.svg"));
}

TEST_F(CliTest, SweepHasABackendAxis) {
  CommandResult r = RunSluice("sweep --model-repository " + kModels.string() +
                              " --model tiny_cnn_aot --batch-sizes 1,4 --iters 3"
                              " --backends torchscript,torchscript+freeze,aotinductor"
                              " --precisions fp32,int8 --results-dir " +
                              (results_ / "out").string());
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::filesystem::path dir;
  for (const auto& e : std::filesystem::directory_iterator(results_ / "out")) dir = e.path();
  std::string csv = ReadFile(dir / "summary.csv");
  // Header + 2 sizes x (3 backends in fp32 + aotinductor in int8).
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 9) << csv;
  EXPECT_THAT(csv, HasSubstr("\n4,torchscript+freeze,fp32,3,0,"));
  EXPECT_THAT(csv, HasSubstr("\n4,aotinductor,int8,3,0,"));
  EXPECT_THAT(r.output, HasSubstr("aotinductor"));
  EXPECT_THAT(ReadFile(dir / "throughput_vs_batch_size.svg"), HasSubstr("aotinductor int8"));
}

TEST_F(CliTest, BenchRunsTheAotInductorPackageOfThePrecision) {
  CommandResult r =
      RunSluice("bench --in-process --model-dir " + (kModels / "tiny_cnn_aot").string() +
                " --precision int8 --batch-size 4 --iters 5 --no-results");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("model_int8.pt2"));
  EXPECT_THAT(r.output, HasSubstr("backend aotinductor, precision int8"));
  EXPECT_THAT(r.output, HasSubstr("Requests (exclude warmup): 5 ok, 0 failed"));
  CommandResult ts =
      RunSluice("bench --in-process --model-dir " + (kModels / "tiny_cnn_aot").string() +
                " --backend torchscript --precision int8 --no-results");
  EXPECT_EQ(ts.exit_code, 2);
  EXPECT_THAT(ts.output, HasSubstr("int8 needs the aotinductor backend"));
}

// The bench measures the model as its config serves it: `optimize: {freeze: true}` freezes it
// unless --no-compile says otherwise, and --compile freezes a model whose config does not.
TEST_F(CliTest, BenchFollowsTheConfigsFreezeUnlessAFlagOverridesIt) {
  const std::filesystem::path model = results_ / "frozen_cnn";
  std::filesystem::create_directories(model);
  std::filesystem::copy_file(kModels / "tiny_cnn" / "model.pt", model / "model.pt");
  std::ofstream(model / "config.yaml")
      << ReadFile(kModels / "tiny_cnn" / "config.yaml") << "optimize: {freeze: true}\n";
  const std::string common = " -b 4 --iters 3 --no-results";
  CommandResult configured = RunSluice("bench --in-process --model-dir " + model.string() + common);
  ASSERT_EQ(configured.exit_code, 0) << configured.output;
  EXPECT_THAT(configured.output, HasSubstr("backend torchscript+freeze,"));
  CommandResult unfrozen =
      RunSluice("bench --in-process --no-compile --model-dir " + model.string() + common);
  ASSERT_EQ(unfrozen.exit_code, 0) << unfrozen.output;
  EXPECT_THAT(unfrozen.output, HasSubstr("backend torchscript,"));
  const std::string plain = (kModels / "tiny_cnn").string();
  CommandResult as_configured = RunSluice("bench --in-process --model-dir " + plain + common);
  EXPECT_THAT(as_configured.output, HasSubstr("backend torchscript,"));
  CommandResult frozen = RunSluice("bench --in-process --compile --model-dir " + plain + common);
  EXPECT_THAT(frozen.output, HasSubstr("backend torchscript+freeze,"));
}

TEST_F(CliTest, BadConfigFailsNamingFileAndKey) {
  std::filesystem::path model = results_ / "bad";
  std::filesystem::create_directories(model);
  std::ofstream(model / "config.yaml") << "max_batch_size: 4\nbatching: {}\n"
                                          "inputs: [{name: x, shape: [2]}]\n"
                                          "outputs: [{name: y, shape: [2]}]\n";
  CommandResult r = RunSluice("bench --in-process --model-dir " + model.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("config.yaml: batching: unknown key"));
}

// SLUICE_QUANT_KERNELS=amx where the CPU has no AMX int8 tiles: a line says so and the best other
// path serves; where it has them, no such line.
TEST_F(CliTest, AmxQuantKernelsAreRefusedWhereTheCpuHasNone) {
  const std::string cpuinfo = ReadFile("/proc/cpuinfo");
  const bool amx = cpuinfo.find(" amx_int8") != std::string::npos;
  std::string command = "SLUICE_QUANT_KERNELS=amx " + std::string(SLUICE_BINARY) + " --help 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  std::array<char, 4096> buffer{};
  size_t n;
  while ((n = fread(buffer.data(), 1, buffer.size(), pipe)) > 0) output.append(buffer.data(), n);
  EXPECT_EQ(pclose(pipe), 0);
  EXPECT_EQ(output.find("is none of"), std::string::npos) << output;
  EXPECT_EQ(output.find("SLUICE_QUANT_KERNELS=amx: this CPU (or its kernel) gives no AMX int8 "
                        "tiles") != std::string::npos,
            !amx)
      << output;
}

TEST_F(CliTest, UsageErrorsAreClear) {
  CommandResult unknown =
      RunSluice("bench --in-process --model no_such_model --model-repository " + kModels.string());
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.output, HasSubstr("no_such_model/config.yaml: cannot open"));
  CommandResult traversal = RunSluice("bench --in-process --model ../etc");
  EXPECT_THAT(traversal.output, HasSubstr("not a valid model name"));
  CommandResult too_big =
      RunSluice("bench --in-process --model-dir " + (kModels / "tiny_cnn").string() +
                " --batch-size 99 --no-results");
  EXPECT_NE(too_big.exit_code, 0);
  EXPECT_THAT(too_big.output, HasSubstr("max_batch_size 8"));
  EXPECT_NE(RunSluice("").exit_code, 0);
}

}  // namespace
