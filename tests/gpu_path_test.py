#!/usr/bin/env python3
"""The GPU path on a machine without a GPU, through the real binary:

- a CPU server never maps the CUDA library, libtorch_cuda, cuBLAS or cuDNN;
- a model that asks for a GPU (instance_group kind KIND_GPU) where there is none fails to load
  with an error naming the config key, while the rest of the repository loads and serves; then
  the CUDA library is loaded (it is what answered) and the CPU model still serves;
- a missing CUDA library is named, with the key;
- `sluice bench` on such a model fails with the same error, exit status 2;
- a language model configured for a GPU is refused at `sluice serve`'s start, naming the key;
- scripts/gpu-check.sh exits 2 with one line.

Usage: gpu_path_test.py SLUICE TEST_MODELS
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
from sluice_server import serving  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_LIBS = ("libsluice_cuda", "libtorch_cuda", "libc10_cuda", "libcublas", "libcudnn", "libnccl")

GPU_CONFIG = """max_batch_size: 4
instance_group:
  - kind: KIND_GPU
    count: 1
    gpus: [0]
precision: fp16
optimize:
  channels_last: true
inputs:
  - name: input
    datatype: FP32
    shape: [3, 16, 16]
outputs:
  - name: logits
    datatype: FP32
    shape: [5]
"""


def check(condition, message):
    if not condition:
        sys.exit(f"gpu_path_test: FAILED: {message}")


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def mapped_cuda_libraries(pid):
    with open(f"/proc/{pid}/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line}
    return sorted(p for p in paths if any(os.path.basename(p).startswith(n) for n in CUDA_LIBS))


def repository(tmp, models, with_gpu_model):
    repo = os.path.join(tmp, "gpu" if with_gpu_model else "cpu")
    if os.path.isdir(repo):
        return repo
    shutil.copytree(os.path.join(models, "identity"), os.path.join(repo, "identity"))
    if with_gpu_model:
        d = os.path.join(repo, "tiny_gpu")
        os.makedirs(d)
        shutil.copy(os.path.join(models, "tiny_cnn", "model.pt"), d)
        with open(os.path.join(d, "config.yaml"), "w") as f:
            f.write(GPU_CONFIG)
    return repo


def identity_serves(port):
    out = post(port, "/v2/models/identity/infer", {"inputs": [
        {"name": "input", "datatype": "FP32", "shape": [1, 16], "data": list(range(16))}]})
    return out["outputs"][0]["data"] == list(range(16))


def test_cpu_server_maps_no_cuda_library(sluice, models, tmp):
    with serving(sluice, ["--model-repository", repository(tmp, models, False)],
                 with_process=True) as (port, server):
        check(identity_serves(port), "identity answered wrongly")
        check(mapped_cuda_libraries(server.pid) == [],
              f"a CPU server mapped {mapped_cuda_libraries(server.pid)}")


def test_gpu_model_without_gpu_fails_alone(sluice, models, tmp):
    with serving(sluice, ["--model-repository", repository(tmp, models, True)],
                 with_process=True) as (port, server):
        index = {m["name"]: m for m in post(port, "/v2/repository/index", {})}
        check(index["identity"]["state"] == "READY", f"identity: {index['identity']}")
        gpu = index["tiny_gpu"]
        check(gpu["state"] == "UNAVAILABLE", f"tiny_gpu: {gpu}")
        reason = gpu.get("reason", "")
        check("instance_group[0].kind" in reason and "GPU" in reason,
              f"the error does not name the key: {reason!r}")
        check(identity_serves(port), "identity stopped serving after the GPU model's failure")
        # The CUDA library was loaded to find there is no GPU: it is the one place that knows.
        if os.path.exists(os.path.join(os.path.dirname(sluice), "libsluice_cuda.so")):
            check(any("libsluice_cuda" in p for p in mapped_cuda_libraries(server.pid)),
                  "the GPU model's failure did not come from the CUDA library")
            check("CUDA finds none" in reason, f"not the CUDA library's error: {reason!r}")
        print(f"gpu_path_test: tiny_gpu: {reason}")


def test_missing_cuda_library_is_named(sluice, models, tmp):
    env = dict(os.environ, SLUICE_CUDA_LIBRARY=os.path.join(tmp, "no-such-libsluice_cuda.so"))
    with serving(sluice, ["--model-repository", repository(tmp, models, True)], env=env) as port:
        index = {m["name"]: m for m in post(port, "/v2/repository/index", {})}
        reason = index["tiny_gpu"].get("reason", "")
        check("instance_group[0].kind" in reason and "no-such-libsluice_cuda.so" in reason,
              f"a missing library is not named: {reason!r}")
        check(index["identity"]["state"] == "READY", "identity did not load")


def test_bench_on_a_gpu_model_fails_clearly(sluice, tmp):
    d = os.path.join(tmp, "gpu", "tiny_gpu")
    r = subprocess.run([sluice, "bench", "--in-process", "--model-dir", d,
                        "--no-results", "--iters", "2"], capture_output=True, text=True,
                       timeout=120)
    check(r.returncode == 2, f"sluice bench exited {r.returncode}: {r.stderr}")
    check("instance_group[0].kind" in r.stderr, f"sluice bench's error: {r.stderr!r}")


def test_language_model_on_a_gpu_without_one_is_refused(sluice, models, tmp):
    """A language model whose config.yaml asks for a GPU (instance_group KIND_GPU) on a machine
    without one: `sluice serve` refuses to start, naming the key and why."""
    d = os.path.join(tmp, "llm_gpu")
    shutil.copytree(os.path.join(models, "tiny_llm"), d)
    with open(os.path.join(d, "config.yaml"), "a") as f:
        f.write("\ninstance_group: [{kind: KIND_GPU}]\n")
    try:
        r = subprocess.run([sluice, "serve", d, "--port", "0"], capture_output=True, text=True,
                           timeout=120)
    except subprocess.TimeoutExpired:
        check(False, "sluice serve started a language model on a GPU this machine lacks")
    check(r.returncode != 0, "sluice serve exited 0")
    check("instance_group[0].kind" in r.stderr and "GPU" in r.stderr,
          f"the error does not name the key: {r.stderr!r}")
    if os.path.exists(os.path.join(os.path.dirname(sluice), "libsluice_cuda.so")):
        check("CUDA finds none" in r.stderr, f"not CUDA's answer: {r.stderr!r}")
    print(f"gpu_path_test: llm_gpu: {r.stderr.strip().splitlines()[-1]}")


def test_gpu_check_exits_2_without_a_gpu():
    if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"],
                                                    capture_output=True).returncode == 0:
        print("gpu_path_test: this machine has a GPU; gpu-check.sh's exit 2 not checked")
        return
    r = subprocess.run([os.path.join(ROOT, "scripts", "gpu-check.sh")], capture_output=True,
                       text=True, timeout=60)
    check(r.returncode == 2, f"gpu-check.sh exited {r.returncode}")
    lines = (r.stdout + r.stderr).strip().splitlines()
    check(len(lines) == 1 and "no NVIDIA GPU" in lines[0], f"gpu-check.sh said {lines}")


def main():
    sluice, models = sys.argv[1], sys.argv[2]
    with tempfile.TemporaryDirectory() as tmp:
        test_cpu_server_maps_no_cuda_library(sluice, models, tmp)
        test_gpu_model_without_gpu_fails_alone(sluice, models, tmp)
        test_missing_cuda_library_is_named(sluice, models, tmp)
        test_bench_on_a_gpu_model_fails_clearly(sluice, tmp)
        test_language_model_on_a_gpu_without_one_is_refused(sluice, models, tmp)
    test_gpu_check_exits_2_without_a_gpu()
    print("gpu_path_test: all checks passed")


if __name__ == "__main__":
    main()
