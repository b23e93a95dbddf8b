# Sourced by the scripts that measure a running server. Defines start_server: it starts
# `sluice serve` on 127.0.0.1 with a free port, waits until it listens, sets $server (its PID),
# $port, $grpc_port (when SERVE_ARGS has --grpc-port) and $work (a scratch folder), and stops the
# server by its PID when the script exits.
# Usage: start_server SLUICE_BINARY SERVE_ARGS...
# use_or_start_server takes the same arguments: with SLUICE_URL (http://127.0.0.1:PORT) set, it
# only sets $port from it and starts nothing (the server there is someone else's to stop).

start_server() {
  local sluice=$1
  shift
  work=$(mktemp -d)
  "$sluice" serve --port 0 "$@" >"$work/server.log" 2>&1 &
  server=$!
  trap 'kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
  port=""
  for _ in $(seq 1 600); do
    port=$(sed -n 's|^Sluice listening on http://127.0.0.1:\([0-9]*\)$|\1|p' "$work/server.log")
    grpc_port=$(sed -n 's|^Sluice gRPC listening on 127.0.0.1:\([0-9]*\)$|\1|p' "$work/server.log")
    [[ -n $port ]] && return 0
    if ! kill -0 "$server" 2>/dev/null; then
      cat "$work/server.log" >&2
      echo "error: the server exited before listening" >&2
      exit 1
    fi
    sleep 0.1
  done
  cat "$work/server.log" >&2
  echo "error: the server did not start within 60 s" >&2
  exit 1
}

use_or_start_server() {
  if [[ -n ${SLUICE_URL:-} ]]; then
    port=${SLUICE_URL##*:}
    port=${port%%/*}
    echo "using the server on $SLUICE_URL"
    return 0
  fi
  start_server "$@"
  echo "server pid $server on http://127.0.0.1:$port"
}
