// `sluice report`: the flag and the page.
#include "report_command.h"

#include <fmt/format.h>

#include <filesystem>

#include "bench/report.h"
#include "bench/results.h"
#include "cli_common.h"

namespace sluice {

CLI::App* AddReportCommand(CLI::App& parent, ReportCommand& cmd) {
  CLI::App* app =
      parent.add_subcommand("report", "Merge results folders into one self-contained HTML page");
  app->add_option("dirs", cmd.dirs, "Results folders (with run.json), or folders holding them")
      ->required();
  app->add_option("--output,-o", cmd.output,
                  "The page to write (default: results/<time>-report/report.html)");
  return app;
}

int RunReportCommand(const ReportCommand& cmd) {
  std::filesystem::path out = cmd.output;
  if (out.empty()) {
    auto dir = CreateRunDirectory("results", "report");
    if (!dir.ok()) return Fail(dir.status());
    out = *dir / "report.html";
  }
  Status written = WriteMergedReport({cmd.dirs.begin(), cmd.dirs.end()}, out);
  if (!written.ok()) return Fail(written);
  fmt::print("Report: {}\n", out.string());
  return 0;
}

}  // namespace sluice
