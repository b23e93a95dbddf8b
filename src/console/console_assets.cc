// The console's files, embedded at build time with the assembler's .incbin: each as served
// and gzip-compressed (CMake copies and compresses them into SLUICE_CONSOLE_FILES: our own from
// assets/, Chart.js, marked and highlight.js from Debian's libjs-* packages, and their licences).
#include <array>

#include "console/console.h"

// Defines symbol_begin and symbol_end around `file` (relative to SLUICE_CONSOLE_FILES) in
// read-only data, visible only inside the binary.
#define SLUICE_EMBED(symbol, file)                                              \
  __asm__(                                                                      \
      ".pushsection .rodata\n"                                                  \
      ".balign 16\n"                                                            \
      ".globl " #symbol                                                         \
      "_begin\n"                                                                \
      ".hidden " #symbol "_begin\n" #symbol                                     \
      "_begin:\n"                                                               \
      ".incbin \"" SLUICE_CONSOLE_FILES "/" file                                \
      "\"\n"                                                                    \
      ".globl " #symbol                                                         \
      "_end\n"                                                                  \
      ".hidden " #symbol "_end\n" #symbol                                       \
      "_end:\n"                                                                 \
      ".popsection\n");                                                         \
  extern "C" __attribute__((visibility("hidden"))) const char symbol##_begin[]; \
  extern "C" __attribute__((visibility("hidden"))) const char symbol##_end[];

#define SLUICE_EMBED_ASSET(symbol, file) \
  SLUICE_EMBED(symbol, file)             \
  SLUICE_EMBED(symbol##_gz, file ".gz")

SLUICE_EMBED_ASSET(sluice_console_index_html, "index.html")
SLUICE_EMBED_ASSET(sluice_console_console_js, "console.js")
SLUICE_EMBED_ASSET(sluice_console_dashboard_js, "dashboard.js")
SLUICE_EMBED_ASSET(sluice_console_try_js, "try.js")
SLUICE_EMBED_ASSET(sluice_console_chat_js, "chat.js")
SLUICE_EMBED_ASSET(sluice_console_bench_js, "bench.js")
SLUICE_EMBED_ASSET(sluice_console_console_css, "console.css")
SLUICE_EMBED_ASSET(sluice_console_chart_js, "chart.min.js")
SLUICE_EMBED_ASSET(sluice_console_marked_js, "marked.min.js")
SLUICE_EMBED_ASSET(sluice_console_highlight_js, "highlight.min.js")
SLUICE_EMBED_ASSET(sluice_console_licenses_txt, "LICENSES.txt")

namespace sluice {
namespace {

#define SLUICE_ASSET(symbol, name, type)                                         \
  ConsoleAsset {                                                                 \
    name, type, std::string_view(symbol##_begin, symbol##_end - symbol##_begin), \
        std::string_view(symbol##_gz_begin, symbol##_gz_end - symbol##_gz_begin) \
  }

const std::array<ConsoleAsset, 11> kAssets = {
    SLUICE_ASSET(sluice_console_index_html, "index.html", "text/html; charset=utf-8"),
    SLUICE_ASSET(sluice_console_console_js, "console.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_dashboard_js, "dashboard.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_try_js, "try.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_chat_js, "chat.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_bench_js, "bench.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_console_css, "console.css", "text/css; charset=utf-8"),
    SLUICE_ASSET(sluice_console_chart_js, "chart.min.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_marked_js, "marked.min.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_highlight_js, "highlight.min.js", "text/javascript; charset=utf-8"),
    SLUICE_ASSET(sluice_console_licenses_txt, "LICENSES.txt", "text/plain; charset=utf-8"),
};

}  // namespace

std::span<const ConsoleAsset> ConsoleAssets() { return kAssets; }

}  // namespace sluice
