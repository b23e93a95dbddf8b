#!/usr/bin/env python3
"""build/machine_peak's output: one JSON object naming each peak this CPU has instructions for
(fp32 FMA; int8 by VPDPBUSD, or VPMADDUBSW on AVX2 without VNNI; bf16 by VDPBF16PS), with
positive rates. benchmarks/vision_peak_fraction.py divides by these, and reports int8 against
fp32's peak when no int8 entry is there.

Usage: machine_peak_test.py path/to/machine_peak
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from precision_auto import cpu_flags  # noqa: E402


def expected(flags):
    want = {}
    if "avx512f" in flags:
        want["fp32"] = "avx512 fma"
    elif {"avx2", "fma"} <= flags:
        want["fp32"] = "avx2 fma"
    if "avx512_bf16" in flags:
        want["bf16"] = "avx512 vdpbf16ps"
    if "avx512_vnni" in flags:
        want["int8"] = "avx512 vpdpbusd"
    elif "avx2" in flags:
        want["int8"] = "avx2 vpmaddubsw"
    return want


def main():
    out = subprocess.run([sys.argv[1], "--seconds", "0.05"], check=True, capture_output=True,
                         text=True, timeout=120).stdout
    report = json.loads(out)
    assert report["cores"] >= 1, report
    got = {row["precision"]: row for row in report["peaks"]}
    want = expected(cpu_flags())
    assert {p: r["isa"] for p, r in got.items()} == want, (got, want)
    for row in report["peaks"]:
        # Rates only, no bound on them: ctest runs this beside other tests on the same cores.
        assert row["gops_one_core"] > 0 and row["gops_all_cores"] > 0, row
    names = ", ".join(f"{p} ({r['isa']})" for p, r in got.items())
    print(f"machine_peak: {names}: ok")


if __name__ == "__main__":
    main()
