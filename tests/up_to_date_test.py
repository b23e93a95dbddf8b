"""tools/up_to_date.py: a command runs the first time, not again while its inputs are unchanged,
again when an input changes, and a failing run leaves no stamp (so the next run repeats it).

    .venv/bin/python tests/up_to_date_test.py
"""
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "up_to_date.py")


def run(folder, fail=False):
    """Runs the tool over a command that appends a line to runs.txt; returns (rc, runs so far)."""
    runs = os.path.join(folder, "runs.txt")
    script = f"echo run >> {runs}" + ("; exit 3" if fail else "")
    rc = subprocess.call([sys.executable, TOOL, "--stamp", os.path.join(folder, "out", ".stamp"),
                          "--inputs", os.path.join(folder, "inputs"), "--", "sh", "-c", script],
                         stdout=subprocess.DEVNULL)
    count = 0
    if os.path.exists(runs):
        with open(runs) as f:
            count = len(f.read().splitlines())
    return rc, count


def write(path, text):
    with open(path, "w") as f:
        f.write(text)


def main():
    with tempfile.TemporaryDirectory() as folder:
        os.makedirs(os.path.join(folder, "inputs", "sub"))
        source = os.path.join(folder, "inputs", "sub", "tool.py")
        write(source, "a")
        assert run(folder) == (0, 1), "the first run must run the command"
        assert os.path.exists(os.path.join(folder, "out", ".stamp"))
        assert run(folder) == (0, 1), "unchanged inputs must not run it again"
        write(source, "b")
        assert run(folder) == (0, 2), "a changed input file must run it again"
        write(os.path.join(folder, "inputs", "new.py"), "c")
        assert run(folder) == (0, 3), "a new input file must run it again"
        write(source, "d")
        assert run(folder, fail=True) == (3, 4), "a failing command's exit code must come back"
        assert not os.path.exists(os.path.join(folder, "out", ".stamp")), "no stamp after failure"
        assert run(folder) == (0, 5), "after a failure it must run again"
        assert run(folder) == (0, 5)
    print("up_to_date: ok")


if __name__ == "__main__":
    main()
