"""Sluice's image preprocessing against torchvision's on PIL images, through a real server.

The model served is a probe: its output is its input, flattened (a view of the input tensor, which
the server must copy out before the request's buffer goes), so /predictions' probabilities
(a softmax of the output, every class listed) give the preprocessed tensor back up to a constant
(log p_i - log p_j = x_i - x_j). The same image goes through torchvision's Resize, CenterCrop,
ToTensor and Normalize on PIL (what a model trained with torchvision saw).
- PNGs (photo-like, and one of one-pixel stripes, which a resize that skips source pixels
  turns into solid colour) agree within PIL's own uint8 rounding between its passes.
- A large JPEG, which Sluice decodes at a reduced DCT scale, agrees with PIL's full-size decode
  and resize within a stated bound (the DCT's reduction is a different low-pass filter).
- A /predict of the same JPEG answers the same probabilities (one path for both routes).

Usage: image_preprocess_test.py SLUICE_BINARY
"""
import base64
import io
import json
import math
import os
import sys
import tempfile
import urllib.request

import numpy as np
import torch
from PIL import Image
from torchvision import transforms

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tools"))
from sluice_server import serving  # noqa: E402
import precision_auto  # noqa: E402

RESIZE, CROP = 40, 32
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
VALUES = 3 * CROP * CROP


class Probe(torch.nn.Module):
    def forward(self, x):
        return x.flatten(1)


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}")


def write_probe(repo):
    model_dir = os.path.join(repo, "probe")
    os.makedirs(model_dir)
    torch.jit.script(Probe()).save(os.path.join(model_dir, "model.pt"))
    with open(os.path.join(model_dir, "config.yaml"), "w") as f:
        f.write(f"""max_batch_size: 4
instances:
  count: 1
  threads: 1
inputs:
  - name: input
    datatype: FP32
    shape: [3, {CROP}, {CROP}]
outputs:
  - name: values
    datatype: FP32
    shape: [{VALUES}]
preprocess:
  image:
    resize: {RESIZE}
    crop: {CROP}
    channels: 3
    mean: {MEAN}
    std: {STD}
postprocess:
  topk: {VALUES}
""")


def served_tensor(port, data):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/predictions/probe", data=data,
                                 headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=30) as r:
        probabilities = json.loads(r.read())
    check(len(probabilities) == VALUES, f"{len(probabilities)} classes answered, not {VALUES}")
    x = np.zeros(VALUES)
    for index, p in probabilities.items():
        check(p > 0, f"probability {p} of class {index}: the output is not the input")
        x[int(index)] = math.log(p)
    return x - x.mean()


def reference_tensor(data):
    pipeline = transforms.Compose([transforms.Resize(RESIZE), transforms.CenterCrop(CROP),
                                   transforms.ToTensor(), transforms.Normalize(MEAN, STD)])
    x = pipeline(Image.open(io.BytesIO(data)).convert("RGB")).flatten().double().numpy()
    return x - x.mean()


def encode(pixels, fmt):
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt, quality=95)
    return out.getvalue()


def photo(height, width, seed):
    x = precision_auto.natural_images(1, max(height, width), [0, 0, 0], [1, 1, 1], seed)[0]
    return (x[:, :height, :width].clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()


def compare(name, got, want, max_bound, mean_bound):
    # In units of one pixel step (1/255) of the channel with the smallest std: a difference of
    # 1.0 is one uint8 step.
    step = 1 / 255 / min(STD)
    diff = np.abs(got - want) / step
    print(f"image_preprocess: {name}: max {diff.max():.2f}, mean {diff.mean():.3f} pixel steps "
          f"from torchvision (bounds {max_bound}, {mean_bound})")
    check(diff.max() <= max_bound and diff.mean() <= mean_bound,
          f"{name}: differs from torchvision's preprocessing by up to {diff.max():.2f} pixel "
          f"steps (mean {diff.mean():.3f})")


def main():
    sluice = sys.argv[1]
    repo = tempfile.mkdtemp(prefix="sluice-preprocess-")
    write_probe(repo)
    stripes = np.zeros((90, 120, 3), dtype=np.uint8)
    stripes[:, ::2, :] = 255  # One-pixel columns: a 3x downscale must average them to grey.
    with serving(sluice, ["--model-repository", repo]) as port:
        # PNG: lossless, so any difference is the preprocessing's. PIL rounds to uint8 after
        # each of its two passes: up to about one step apart, a fraction of one on average.
        for name, pixels in (("photo 96x128 PNG", photo(96, 128, 1)),
                             ("photo 150x110 PNG", photo(150, 110, 2)),
                             ("stripes 90x120 PNG", stripes)):
            data = encode(pixels, "PNG")
            compare(name, served_tensor(port, data), reference_tensor(data), 1.2, 0.35)
        # A 640x480 JPEG decodes at 1/8 scale (80x60, the smallest whose shorter side is still
        # >= the 40-pixel resize) before the resize; PIL decodes all of it.
        data = encode(photo(480, 640, 3), "JPEG")
        got = served_tensor(port, data)
        compare("photo 640x480 JPEG (DCT-scaled decode)", got, reference_tensor(data), 8, 1.2)
        body = json.dumps({"model": "probe", "image": base64.b64encode(data).decode()}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/predict", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            reply = json.loads(r.read())
        top = reply["topk"][0]
        check(top["index"] == int(np.argmax(got)), "/predict and /predictions preprocess alike")
    print("image_preprocess: OK")


if __name__ == "__main__":
    main()
