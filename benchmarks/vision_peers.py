#!/usr/bin/env python3
"""ResNet-18 over HTTP: Sluice beside LitServe and TorchServe, same model file, same JPEG, same
client, in the same run.

Each server serves models/resnet18's TorchScript file (model.pt) on its own default path with the
same batching (up to 64 images, 2 ms of waiting): LitServe with a LitAPI that decodes the base64
JPEG with PIL and torchvision's transforms (resize 256, centre crop 224, ImageNet normalisation),
batches with torch.stack and runs the TorchScript model; TorchServe with its own image_classifier
handler (the same transforms) behind its Java frontend, one worker. Sluice serves the model's
config as exported (its `precision: auto` choice) on /predict (LitServe's base64 JSON) and
/predictions/resnet18 (TorchServe's raw bytes).

The client is `sluice bench --url` (closed loop: N connections, each with one request in flight,
a refused request sent again at once); only 2xx answers count. `--client-nice 19` runs it at the
lowest CPU priority, for every server alike. Per round every server is started, measured at each connection count and
stopped by its PID, in alternating order (A B C, then C B A) so the machine's drift falls on all.

Usage:
  .venv/bin/python benchmarks/vision_peers.py --sluice build/sluice --models models \\
      --connections 1,8,64 --duration 10 --rounds 2 [--image photo.jpg] [--out results/x.csv]
"""
import argparse
import csv
import io
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
PYTHON = sys.executable
sys.path.insert(0, os.path.join(ROOT, "tools"))

import precision_auto  # noqa: E402

LITSERVE_APP = r'''
import base64, io, sys
import litserve as ls
import torch
from PIL import Image
from torchvision import transforms

MODEL, PORT = sys.argv[1], int(sys.argv[2])
PREPROCESS = transforms.Compose([
    transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
    transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])


class ResNetApi(ls.LitAPI):
    def setup(self, device):
        self.model = torch.jit.load(MODEL).eval()

    def decode_request(self, request):
        image = Image.open(io.BytesIO(base64.b64decode(request["image"]))).convert("RGB")
        return PREPROCESS(image)

    def batch(self, inputs):
        return torch.stack(inputs)

    def predict(self, x):
        with torch.inference_mode():
            return self.model(x).softmax(1)

    def unbatch(self, output):
        return list(output)

    def encode_response(self, output):
        top = output.topk(5)
        return {"predictions": [{"class": int(i), "score": float(s)}
                                for s, i in zip(top.values, top.indices)]}


if __name__ == "__main__":
    api = ResNetApi(max_batch_size=64, batch_timeout=0.002)
    ls.LitServer(api, accelerator="cpu", workers_per_device=1).run(
        host="127.0.0.1", port=PORT, generate_client_file=False)
'''


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url, timeout, proc, method="GET", data=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before answering {url}")
        try:
            req = urllib.request.Request(url, data=data, method=method)
            with urllib.request.urlopen(req, timeout=5) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not answer 200 within {timeout} s")


def stop(proc):
    """Stops a server and every process it started (its own session) by its PID."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # Children left behind (TorchServe's workers) share the session.
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Server:
    def __init__(self, name, endpoint, work):
        self.name, self.endpoint, self.work = name, endpoint, work
        self.proc = None
        self.port = free_port()
        self.log = open(os.path.join(work, f"{name}.log"), "ab")

    def spawn(self, argv, env=None):
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=env, cwd=self.work)

    def stop(self):
        if self.proc:
            stop(self.proc)
            self.proc = None


class Sluice(Server):
    """Sluice on `endpoint`, serving the model's config as exported or, with `precision`, a copy
    of its directory (links to its files) whose config pins that precision."""

    def __init__(self, work, args, endpoint, precision=None):
        super().__init__(f"sluice-{endpoint}" + (f"-{precision}" if precision else ""),
                         endpoint, work)
        self.args = args
        self.repository = args.models
        if precision:
            self.repository = os.path.join(work, f"repo-{precision}")
            source = os.path.abspath(os.path.join(args.models, args.model))
            target = os.path.join(self.repository, args.model)
            os.makedirs(target, exist_ok=True)
            for name in os.listdir(source):
                if name != "config.yaml" and not os.path.exists(os.path.join(target, name)):
                    os.symlink(os.path.join(source, name), os.path.join(target, name))
            with open(os.path.join(source, "config.yaml")) as f:
                text = f.read()
            with open(os.path.join(target, "config.yaml"), "w") as f:
                f.write(precision_auto.replace_precision(text, f"precision: {precision}\n",
                                                         f"{source}/config.yaml"))

    def start(self):
        self.spawn([self.args.sluice, "serve", "--model-repository", self.repository,
                    "--model", self.args.model, "--port", str(self.port), "--host", "127.0.0.1"])
        wait_http(f"http://127.0.0.1:{self.port}/v2/health/ready", 300, self.proc)


class LitServe(Server):
    def __init__(self, work, args):
        super().__init__("litserve", "predict", work)
        self.args = args
        self.app = os.path.join(work, "litserve_resnet18.py")
        with open(self.app, "w") as f:
            f.write(LITSERVE_APP)

    def start(self):
        model = os.path.abspath(os.path.join(self.args.models, self.args.model, "model.pt"))
        self.spawn([PYTHON, self.app, model, str(self.port)])
        wait_http(f"http://127.0.0.1:{self.port}/health", 300, self.proc)


class TorchServe(Server):
    def __init__(self, work, args):
        super().__init__("torchserve", "predictions", work)
        self.args = args
        self.store = os.path.join(work, "model-store")
        os.makedirs(self.store, exist_ok=True)
        self.management = free_port()
        self.metrics = free_port()
        model = os.path.abspath(os.path.join(args.models, args.model, "model.pt"))
        subprocess.run([os.path.join(os.path.dirname(PYTHON), "torch-model-archiver"),
                        "--model-name", args.model, "--version", "1.0", "--serialized-file",
                        model, "--handler", "image_classifier", "--export-path", self.store,
                        "--force"], check=True)
        self.config = os.path.join(work, "config.properties")
        with open(self.config, "w") as f:
            f.write(f"inference_address=http://127.0.0.1:{self.port}\n"
                    f"management_address=http://127.0.0.1:{self.management}\n"
                    f"metrics_address=http://127.0.0.1:{self.metrics}\n"
                    "disable_token_authorization=true\nenable_model_api=true\n"
                    "install_py_dep_per_model=false\ndisable_system_metrics=true\n")

    def start(self):
        env = dict(os.environ, PATH=os.path.dirname(PYTHON) + ":" + os.environ["PATH"])
        self.spawn([os.path.join(os.path.dirname(PYTHON), "torchserve"), "--start",
                    "--foreground", "--ncs", "--model-store", self.store, "--ts-config",
                    self.config, "--disable-token-auth"], env=env)
        wait_http(f"http://127.0.0.1:{self.port}/ping", 300, self.proc)
        url = (f"http://127.0.0.1:{self.management}/models?url={self.args.model}.mar"
               "&batch_size=64&max_batch_delay=2&initial_workers=1&synchronous=true")
        try:  # Synchronous: answers once the worker has loaded the model, or failed to.
            urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"),
                                   timeout=300).read()
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"TorchServe refused the model: {e.read().decode()[:500]} "
                               f"(log: {self.log.name})") from None


def measure(server, args, image, results_dir):
    out = os.path.join(results_dir, f"{server.name}-{time.time_ns()}")
    argv = [args.sluice, "bench", "--url", f"http://127.0.0.1:{server.port}", "--model",
            args.model, "--endpoint", server.endpoint, "--input", image, "--concurrency",
            args.connections, "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--results-dir", out]
    if args.client_nice:
        argv = ["nice", "-n", str(args.client_nice)] + argv
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    runs = [os.path.join(out, d) for d in os.listdir(out)]
    with open(os.path.join(runs[0], "summary.json")) as f:
        levels = json.load(f)["levels"]
    return {lvl["concurrency"]: {"good_per_s": lvl["ok_requests"] / lvl["duration_seconds"],
                                 "requests": lvl["requests"], "ok": lvl["ok_requests"],
                                 "p50_ms": 1000 * lvl["latency_seconds"]["p50"]
                                 if "latency_seconds" in lvl else None}
            for lvl in levels}


def make_image(path):
    """A 500 x 375 JPEG (quality 90), ImageNet's commonest size, of a synthetic natural scene."""
    from PIL import Image
    x = precision_auto.natural_images(1, 512, [0, 0, 0], [1, 1, 1], seed=9)[0, :, :375, :500]
    pixels = (x.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    Image.fromarray(pixels).save(path, quality=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sluice", default=os.path.join(ROOT, "build", "sluice"))
    parser.add_argument("--models", default=os.path.join(ROOT, "models"))
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image", help="JPEG to send (default: a synthetic 500 x 375 photo)")
    parser.add_argument("--connections", default="1,8,64")
    parser.add_argument("--duration", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--servers", default="sluice-predict,sluice-predictions,litserve,torchserve",
                        help="litserve, torchserve, sluice-predict or sluice-predictions (the "
                        "config as exported), each Sluice one with -fp32, -bf16 or -int8 to pin "
                        "that precision")
    parser.add_argument("--client-nice", type=int, default=0,
                        help="run the client at this CPU niceness (19: it takes only the cycles "
                        "the server leaves, as a client on another machine would; a client that "
                        "resends a refused request at once otherwise competes with the model for "
                        "the cores it shares)")
    parser.add_argument("--out", help="CSV of every measurement")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="sluice-vision-peers-")
    image = args.image or os.path.join(work, "photo.jpg")
    if not args.image:
        make_image(image)
    def make(name):
        if name == "litserve":
            return LitServe(work, args)
        if name == "torchserve":
            return TorchServe(work, args)
        match = re.fullmatch(r"sluice-(predict|predictions)(?:-(fp32|bf16|int8))?", name)
        if not match:
            sys.exit(f"unknown server {name!r}: litserve, torchserve, "
                     "sluice-{predict,predictions}[-{fp32,bf16,int8}]")
        return Sluice(work, args, match.group(1), match.group(2))

    servers = [make(name) for name in args.servers.split(",")]
    rows = []
    try:
        for r in range(args.rounds):
            for server in (servers if r % 2 == 0 else servers[::-1]):
                server.start()
                try:
                    for conns, m in measure(server, args, image, work).items():
                        rows.append({"round": r + 1, "server": server.name,
                                     "connections": conns, **m})
                        print(f"round {r + 1} {server.name:20s} {conns:3d} connections: "
                              f"{m['good_per_s']:7.1f} good answers/s ({m['ok']} of "
                              f"{m['requests']} 2xx)", flush=True)
                finally:
                    server.stop()
    finally:
        for server in servers:
            server.stop()
    if args.out:
        with open(args.out, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    print("\nmedian good answers/s over rounds")
    names = [s.name for s in servers]
    levels = sorted({row["connections"] for row in rows})
    print("| connections | " + " | ".join(names) + " | Sluice as exported / best peer |")
    print("|---" * (len(names) + 2) + "|")
    for c in levels:
        med = {n: statistics.median(row["good_per_s"] for row in rows
                                    if row["server"] == n and row["connections"] == c)
               for n in names}
        ours = max((v for n, v in med.items()
                    if re.fullmatch(r"sluice-(predict|predictions)", n)), default=0)
        peers = max((v for n, v in med.items() if not n.startswith("sluice")), default=0)
        ratio = f"{ours / peers:.2f}" if peers else "n/a"
        print(f"| {c} | " + " | ".join(f"{med[n]:.1f}" for n in names) + f" | {ratio} |")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
