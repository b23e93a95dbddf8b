"""Runs a command that writes files unless what it wrote last time is still up to date.

The command's fingerprint covers the files named by --inputs (each file, or every file under each
folder, by content), the command line itself, the Python version and this CPU's model and feature
flags (the AOTInductor packages the export tools write are compiled for the CPU). When the
--stamp file holds the same fingerprint, the command is not run; otherwise the stamp is removed,
the command runs, and the fingerprint is written only when it succeeds. The tests' model exports
use it: a second `ctest`, or the sanitizer build's tests on the release build's test models, do
not export again what the same tools already wrote.

    .venv/bin/python tools/up_to_date.py --stamp build/test-models/.stamp-models \\
        --inputs tools requirements.txt -- .venv/bin/python tools/export_models.py --test ...

Exit code: the command's, or 0 when it was up to date.
"""
import argparse
import hashlib
import os
import platform
import subprocess
import sys


def cpu_identity():
    lines = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("vendor_id", "cpu family", "model", "model name", "flags"):
                    lines.append(line.strip())
                elif not line.strip() and lines:
                    break  # The first processor is enough.
    except OSError:
        lines.append(platform.processor())
    return "\n".join(lines)


def input_files(paths):
    files = []
    for path in paths:
        if os.path.isdir(path):
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                files.extend(os.path.join(root, n) for n in sorted(names))
        elif os.path.isfile(path):
            files.append(path)
        else:
            sys.exit(f"up_to_date.py: input {path} does not exist")
    return files


def fingerprint(inputs, command):
    digest = hashlib.sha256()
    for part in ["\0".join(command), sys.version, cpu_identity()]:
        digest.update(part.encode() + b"\n")
    for path in input_files(inputs):
        digest.update(os.path.abspath(path).encode() + b"\n")
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stamp", required=True, help="file holding the last run's fingerprint")
    parser.add_argument("--inputs", nargs="+", required=True,
                        help="files and folders whose contents the output depends on")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given (after --)")
    wanted = fingerprint(args.inputs, command)
    try:
        with open(args.stamp) as f:
            if f.read().strip() == wanted:
                print(f"up to date ({args.stamp}): {' '.join(command)}")
                return 0
    except FileNotFoundError:
        pass
    if os.path.exists(args.stamp):
        os.remove(args.stamp)
    rc = subprocess.call(command)
    if rc == 0:
        os.makedirs(os.path.dirname(os.path.abspath(args.stamp)), exist_ok=True)
        with open(args.stamp + ".tmp", "w") as f:
            f.write(wanted + "\n")
        os.replace(args.stamp + ".tmp", args.stamp)
    return rc


if __name__ == "__main__":
    sys.exit(main())
