#!/usr/bin/env python3
"""Checks what a running Sluice answers for resnet18_gpu models against PyTorch eager in fp32 on
the same seeded weights: random UINT8 [N, 224, 224, 3] images sent over KServe v2 (binary
extension), the logits compared by relative error (||sluice - eager|| / ||eager||) and top-1
agreement. Each model passes under its precision's bound (fp32 with TF32 convolutions: 5e-3;
fp16: 2e-2) with top-1 agreement >= 0.9.

Usage: gpu_agreement.py --url http://127.0.0.1:PORT --models m1:fp16 m2:fp32 ... [--out FILE]
"""
import argparse
import json
import sys
import urllib.request

import torch

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]
BOUND = {"fp32": 5e-3, "fp16": 2e-2, "bf16": 5e-2}


def infer(url, model, images):
    header = json.dumps({
        "inputs": [{"name": "input", "datatype": "UINT8", "shape": list(images.shape),
                    "parameters": {"binary_data_size": images.numel()}}],
        "outputs": [{"name": "logits", "parameters": {"binary_data": False}}]}).encode()
    body = header + images.numpy().tobytes()
    req = urllib.request.Request(f"{url}/v2/models/{model}/infer", data=body, method="POST",
                                 headers={"Inference-Header-Content-Length": str(len(header)),
                                          "Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    logits = out["outputs"][0]
    return torch.tensor(logits["data"], dtype=torch.float32).view(logits["shape"])


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--models", nargs="+", required=True, help="NAME:PRECISION")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--out")
    args = parser.parse_args()
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=1000).eval()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device)
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    generator = torch.Generator().manual_seed(3)
    images = torch.randint(0, 256, (args.batch, 224, 224, 3), dtype=torch.uint8,
                           generator=generator)
    x = images.permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    with torch.no_grad():
        want = model(x.to(device)).float().cpu()
    results, ok = [], True
    for item in args.models:
        name, precision = item.split(":")
        try:
            got = infer(args.url, name, images)
            err = ((got - want).norm() / want.norm()).item()
            top1 = (got.argmax(1) == want.argmax(1)).float().mean().item()
            passed = err < BOUND[precision] and top1 >= 0.9 and bool(torch.isfinite(got).all())
        except Exception as e:  # noqa: BLE001 - reported, and the check fails
            err, top1, passed = float("nan"), 0.0, False
            print(f"gpu_agreement: {name}: {e}")
        ok &= passed
        results.append({"model": name, "precision": precision, "relative_error": err,
                        "top1_agreement": top1, "bound": BOUND[precision], "passed": passed})
        print(f"gpu_agreement: {name} ({precision}): relative error {err:.2e} (bound "
              f"{BOUND[precision]:.0e}), top-1 agreement {top1:.3f}: "
              f"{'ok' if passed else 'FAILED'}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
