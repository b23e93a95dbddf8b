"""Starts `sluice serve` for a black-box test and stops it by its PID (SIGTERM, then kill).

    with serving(sluice, ["--model-repository", repo]) as port:
        ...  # talk to http://127.0.0.1:<port>

With "--grpc-port", "0" among the arguments it yields (http_port, grpc_port).
"""
import contextlib
import re
import signal
import subprocess
import sys


@contextlib.contextmanager
def serving(sluice, args, start_timeout=120, env=None):
    server = subprocess.Popen([sluice, "serve", "--port", "0", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env)
    try:
        port = grpc_port = None
        for line in server.stdout:
            match = re.search(r"gRPC listening on 127\.0\.0\.1:(\d+)", line)
            if match:
                grpc_port = int(match.group(1))
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        if port is None or ("--grpc-port" in args and grpc_port is None):
            sys.exit(f"sluice serve did not start: {server.stdout.read()}")
        yield (port, grpc_port) if "--grpc-port" in args else port
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            raise
