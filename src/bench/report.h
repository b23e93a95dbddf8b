// report.html: one self-contained page per results folder, and one merged page for several.
//
// A report is read back from the result files (run.json, summary.json, the samples and
// utilisation CSVs), so a folder written by any version of the benches, or several of them, can
// be rendered again: `sluice report DIR...`. The page holds the run's configuration, the machine
// (CPU model, cores, libtorch, commit), the tables, and the plots inline as SVG: throughput and
// latency against batch size or concurrency, the latency-throughput curve, latency histograms and
// utilisation over time. Nothing is fetched: no script, font or image, and a
// Content-Security-Policy that forbids them. A merged page adds comparisons: runs of the same kind
// and model side by side with their ratios to the first.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "sluice/status.h"

namespace sluice {

struct ReportTable {
  std::string title;
  std::vector<std::string> header;
  std::vector<std::vector<std::string>> rows;
};

// One results folder, read back.
struct ReportRun {
  std::filesystem::path dir;
  std::string kind;   // "in-process bench", "HTTP bench", "gRPC bench", "sweep", "LLM bench".
  std::string model;  // As the run named it.
  std::string title;  // e.g. "HTTP bench of fashion_mnist".
  std::vector<std::pair<std::string, std::string>> about;   // Command, started, machine, ...
  std::vector<std::pair<std::string, std::string>> config;  // Flattened "a.b.c" -> value.
  std::vector<ReportTable> tables;
  std::vector<std::string> plots;  // SVG documents.
  // For comparisons between runs: (key, value) of the headline figure per level or cell, e.g.
  // ("64 connections", requests/s), and the tail latency at the same keys.
  std::string throughput_unit;
  std::vector<std::pair<std::string, double>> throughput;
  std::vector<std::pair<std::string, double>> p99_ms;
  std::vector<std::pair<double, double>> throughput_by_x;  // (concurrency or batch size, value).
  std::string x_label;                                     // "concurrency", "batch size".
};

// Reads one results folder. kNotFound when it holds no run.json; kInvalidArgument when its files
// cannot be read as a Sluice run.
Result<ReportRun> ReadRunForReport(const std::filesystem::path& dir);

// The folders to report on: each argument that holds a run.json, else the folders directly inside
// it that do (so `sluice report results/` reports every run there), in name order.
Result<std::vector<std::filesystem::path>> FindRunDirectories(
    const std::vector<std::filesystem::path>& paths);

// The page for `runs` (one run: its own report; several: with comparisons).
std::string RenderReportHtml(const std::vector<ReportRun>& runs, const std::string& title);

// <dir>/report.html for the run in `dir`.
Status WriteRunReport(const std::filesystem::path& dir);

// One page for every run in `dirs` (see FindRunDirectories) at `out`.
Status WriteMergedReport(const std::vector<std::filesystem::path>& dirs,
                         const std::filesystem::path& out);

}  // namespace sluice
