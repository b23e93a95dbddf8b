#!/usr/bin/env python3
"""Fashion-MNIST test accuracy through a running Sluice server.

Sends each of the 10,000 test images as a PNG to POST /predictions/<model> (one keep-alive
connection, in order), takes the top label of each answer, and compares the accuracy with the
one recorded at training time (models/<model>/training.json, fp32): equal to 4 decimals, or
within --tolerance points (for a bf16 or int8 package; scripts/fashion-accuracy.sh).

Usage: tools/fashion_accuracy.py --url http://127.0.0.1:8000 [--model fashion_mnist]
       [--models models] [--limit N] [--tolerance POINTS] [--label TEXT]
"""
import argparse
import gzip
import http.client
import io
import json
import os
import struct
import sys
import urllib.parse

from PIL import Image

FASHION_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    return shape, data[4 + 4 * dims:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="fashion_mnist")
    parser.add_argument("--models", default="models", help="model repository (for labels and the recorded accuracy)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N images")
    parser.add_argument("--tolerance", type=float, default=0.0,
                        help="accuracy points the result may differ from the recorded one "
                             "(0: equal to 4 decimals)")
    parser.add_argument("--label", default="", help="what is measured, for the report line")
    args = parser.parse_args()

    (count, rows, cols), pixels = read_idx(os.path.join(FASHION_DIR, "t10k-images-idx3-ubyte.gz"))
    _, labels = read_idx(os.path.join(FASHION_DIR, "t10k-labels-idx1-ubyte.gz"))
    if args.limit:
        count = min(count, args.limit)
    model_dir = os.path.join(args.models, args.model)
    with open(os.path.join(model_dir, "labels.txt")) as f:
        names = [line.rstrip("\n") for line in f]
    with open(os.path.join(model_dir, "training.json")) as f:
        recorded = json.load(f)["test_accuracy"]

    url = urllib.parse.urlparse(args.url)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80)
    correct = 0
    size = rows * cols
    for i in range(count):
        image = Image.frombytes("L", (cols, rows), pixels[i * size:(i + 1) * size])
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        conn.request("POST", f"/predictions/{args.model}", body=buffer.getvalue(),
                     headers={"Content-Type": "image/png"})
        response = conn.getresponse()
        body = response.read()
        if response.status != 200:
            sys.exit(f"image {i}: HTTP {response.status}: {body.decode(errors='replace')}")
        top = next(iter(json.loads(body)))  # Labels come in descending probability.
        correct += top == names[labels[i]]
    accuracy = correct / count
    points = (accuracy - recorded) * 100
    if args.tolerance > 0:
        ok = abs(points) <= args.tolerance
        verdict = f"{points:+.2f} points, {'within' if ok else 'BEYOND'} {args.tolerance} points"
    else:
        ok = round(accuracy, 4) == round(recorded, 4)
        verdict = "equal" if ok else "DIFFERENT"
    label = f" ({args.label})" if args.label else ""
    print(f"{args.model}{label}: {correct}/{count} correct through /predictions, accuracy "
          f"{accuracy:.4f}; recorded at training (fp32) {recorded:.4f}; {verdict}")
    return 0 if count < 10000 or ok else 1


if __name__ == "__main__":
    sys.exit(main())
