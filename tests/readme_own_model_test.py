#!/usr/bin/env python3
"""The README's "Serving your own model" lines, run as written on a small model, then served.

Takes the python and yaml blocks marked <!-- own-model:python --> and <!-- own-model:config -->
from README.md, runs the python block in a temporary directory with MyModel defined, writes the
config beside the package, starts `sluice serve` on 127.0.0.1 (a free port), and checks that
KServe v2 inference gives PyTorch's outputs within 1e-4 for batches of 1 and 16.

Usage: tests/readme_own_model_test.py SLUICE_BINARY
"""
import json
import os
import re
import sys
import tempfile
import urllib.request

import torch
import torch.nn as nn
import torch.nn.functional as F

from sluice_server import serving

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.fc = nn.Linear(8 * 16 * 16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(torch.flatten(x, 1))


def block(readme, marker, language):
    match = re.search(rf"<!-- own-model:{marker} -->\s*```{language}\n(.*?)```", readme, re.S)
    if not match:
        sys.exit(f"README.md has no ```{language} block after <!-- own-model:{marker} -->")
    return match.group(1)


def infer(port, x):
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": list(x.shape),
                                   "data": x.flatten().tolist()}]}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/my_model/infer",
                                     data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        reply = json.load(response)
    out = reply["outputs"][0]
    return torch.tensor(out["data"], dtype=torch.float32).reshape(out["shape"])


def main():
    sluice = os.path.abspath(sys.argv[1])
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    code, config = block(readme, "python", "python"), block(readme, "config", "yaml")
    with tempfile.TemporaryDirectory() as work:
        os.chdir(work)
        torch.manual_seed(0)
        namespace = {"MyModel": MyModel}
        exec(compile(code, "README.md", "exec"), namespace)
        model = namespace["model"]
        with open("models/my_model/config.yaml", "w") as f:
            f.write(config)
        with serving(sluice, ["--model-repository", "models"]) as port:
            for batch in (1, 16):
                x = torch.randn(batch, 3, 32, 32)
                with torch.no_grad():
                    expected = model(x)
                got = infer(port, x)
                error = (got - expected).abs().max().item()
                print(f"batch {batch}: max abs error {error:.2e}")
                if got.shape != expected.shape or error > 1e-4:
                    sys.exit(f"batch {batch}: served {tuple(got.shape)} differs from PyTorch "
                             f"(max abs error {error})")
    print("README own-model lines: package served, outputs match PyTorch")


if __name__ == "__main__":
    main()
