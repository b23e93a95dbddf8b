// `sluice serve`: its flags, and the run that loads the backends and hands over to RunServer().
#pragma once

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "llm/load_llm.h"
#include "serve/serve.h"

namespace sluice {

struct ServeCommand {
  ServeOptions options;
  llm::LlmLoadOverrides llm_overrides;
  ProfileSwitch profile;
  // Seconds as the flags take them, into `options` when the command runs.
  double idle_seconds = ServeOptions{}.http.idle_timeout.count();
  double header_seconds = ServeOptions{}.http.header_timeout.count();
  double body_seconds = ServeOptions{}.http.body_timeout.count();
  double drain_seconds = ServeOptions{}.drain_delay.count();
  double grace_seconds = ServeOptions{}.shutdown_grace.count();
  double keep_alive_seconds = ServeOptions{}.keep_alive.count();
  double load_wait_seconds = ServeOptions{}.load_wait.count();
};

// Adds the `serve` subcommand to `parent`, its flags writing into `cmd`.
CLI::App* AddServeCommand(CLI::App& parent, ServeCommand& cmd);

// Serves until a termination signal; returns the process's exit code.
int RunServeCommand(ServeCommand& cmd);

}  // namespace sluice
