// `sluice report`: results folders merged into one self-contained HTML page.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

namespace sluice {

struct ReportCommand {
  std::vector<std::string> dirs;  // Results folders (with run.json), or folders holding them.
  std::string output;             // The page; empty: results/<time>-report/report.html.
};

// Adds the `report` subcommand to `parent`, its flags writing into `cmd`.
CLI::App* AddReportCommand(CLI::App& parent, ReportCommand& cmd);

// Writes the page; returns the process's exit code.
int RunReportCommand(const ReportCommand& cmd);

}  // namespace sluice
