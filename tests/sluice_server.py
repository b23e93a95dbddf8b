"""Starts `sluice serve` for a black-box test and stops it by its PID (SIGTERM, then kill).

A server that does not exit promptly after SIGTERM, or that waits out its shutdown grace with
connections or requests still open, fails the test with its output (and its threads' stacks).

    with serving(sluice, ["--model-repository", repo]) as port:
        ...  # talk to http://127.0.0.1:<port>

With "--grpc-port", "0" among the arguments it yields (http_port, grpc_port); with
with_process=True, (port, the subprocess.Popen) instead of the port. `startup`, a list, receives
the lines the server printed up to its listening line.
"""
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading


@contextlib.contextmanager
def serving(sluice, args, env=None, exit_timeout=45, with_process=False, startup=None):
    server = subprocess.Popen([sluice, "serve", "--port", "0", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env)
    reader = None
    try:
        port = grpc_port = None
        for line in server.stdout:
            if startup is not None:
                startup.append(line)
            match = re.search(r"gRPC listening on 127\.0\.0\.1:(\d+)", line)
            if match:
                grpc_port = int(match.group(1))
            match = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        if port is None or ("--grpc-port" in args and grpc_port is None):
            sys.exit(f"sluice serve did not start: {server.stdout.read()}")
        # The rest of its output is read as it comes, so a chatty server never blocks on a full pipe.
        output = []
        reader = threading.Thread(target=lambda: output.extend(server.stdout), daemon=True)
        reader.start()
        if with_process:
            yield port, server
        else:
            yield (port, grpc_port) if "--grpc-port" in args else port
    finally:
        def finish_reading():
            if reader is None:
                return server.stdout.read()
            reader.join(timeout=10)
            return "".join(output)

        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=exit_timeout)
        except subprocess.TimeoutExpired:
            stacks = thread_stacks(server.pid)
            server.kill()
            server.wait()
            rest = finish_reading()
            sys.exit(f"sluice serve (pid {server.pid}) did not exit within {exit_timeout} s of "
                     f"SIGTERM.\nIts output after it started:\n{rest}\nIts threads:\n{stacks}")
        rest = finish_reading()
        # Under the sanitizers (make test-asan) a leak or a memory error ends the server with
        # its report: the test fails with it.
        for report in ("ERROR: LeakSanitizer", "ERROR: AddressSanitizer", "runtime error:"):
            if report in rest and sys.exc_info()[0] is None:
                sys.exit(f"sluice serve (pid {server.pid}) reported at exit:\n{rest[-20000:]}")
        if "shutdown grace expired" in rest and sys.exc_info()[0] is None:
            sys.exit(f"sluice serve left something open at SIGTERM:\n{rest}")


def thread_stacks(pid):
    """Every thread's stack of a running process, by gdb (when installed), for a hang's report."""
    gdb = shutil.which("gdb")
    if gdb is None:
        return "(gdb is not installed)"
    try:
        return subprocess.run([gdb, "-p", str(pid), "-batch", "-nx", "-ex", "thread apply all bt"],
                              capture_output=True, text=True, timeout=60).stdout
    except subprocess.TimeoutExpired:
        return "(gdb did not finish within 60 s)"


# A tool-calling chat template in the Hermes / Qwen2.5 format (<tool_call>{...}</tool_call>).
HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{%- for tool in tools %}\n{{ tool | tojson }}"
    "{%- endfor %}<|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant\n"
    "{%- for call in message.tool_calls %}<tool_call>\n{\"name\": \"{{ call.function.name }}\", "
    "\"arguments\": {{ call.function.arguments | tojson }}}\n</tool_call>{%- endfor %}"
    "<|im_end|>\n"
    "{%- elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}"
    "\n</tool_response><|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


def write_model(test_models, model, chat_template=None, config_yaml=None):
    """The tiny test language model in the folder `model` (which must exist), its files linked;
    its chat template `chat_template` and its config.yaml `config_yaml`, where given."""
    source = os.path.abspath(os.path.join(test_models, "tiny_llm"))
    replaced = set()
    if chat_template is not None:
        replaced |= {"chat_template.jinja", "tokenizer_config.json"}
    if config_yaml is not None:
        replaced.add("config.yaml")
    for name in os.listdir(source):
        if name not in replaced:
            os.symlink(os.path.join(source, name), os.path.join(model, name))
    if config_yaml is not None:
        with open(os.path.join(model, "config.yaml"), "w") as f:
            f.write(config_yaml)
    if chat_template is not None:
        with open(os.path.join(source, "tokenizer_config.json")) as f:
            config = json.load(f)
        config["chat_template"] = chat_template
        with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
            json.dump(config, f)
        with open(os.path.join(model, "chat_template.jinja"), "w") as f:
            f.write(chat_template)


@contextlib.contextmanager
def templated_model(test_models, chat_template, config_yaml=None):
    """A copy of the tiny test language model (its files linked) whose chat template is
    `chat_template` (and config.yaml `config_yaml`, where given); yields its directory."""
    with tempfile.TemporaryDirectory() as model:
        write_model(test_models, model, chat_template, config_yaml)
        yield model
