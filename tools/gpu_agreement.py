#!/usr/bin/env python3
"""Checks what a running Sluice answers for resnet18_gpu models against PyTorch eager in fp32 on
the same seeded weights: random UINT8 [N, 224, 224, 3] images sent over KServe v2 (binary
extension), the logits compared by relative error (||sluice - eager|| / ||eager||) and top-1
agreement. Each model passes under its precision's bound (fp32 with TF32 convolutions: 5e-3;
fp16: 2e-2) with top-1 agreement >= 0.9.

Then, with --concurrency C (the GPU check uses 64), each model again under load: --requests
requests of 1 to 8 images drawn from a pool of 256, C at once (the server batches them, and its
copy slots overlap), every answer compared with the eager logits of its own images. A batch's
outputs overwritten by another's (a memory pool shared by graphs of different copy slots, a
buffer reused too early) makes some answers another request's, or garbage: every answer must be
within its precision's bound and the right shape.

Usage: gpu_agreement.py --url http://127.0.0.1:PORT --models m1:fp16 m2:fp32 ... [--out FILE]
                        [--concurrency 64 --requests 1024]
"""
import argparse
import concurrent.futures
import json
import random
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


def eager_logits(model, images, device, batch=32):
    """fp32 logits of UINT8 [N, 224, 224, 3] images, normalised as the server's config does."""
    out = []
    for i in range(0, len(images), batch):
        x = images[i:i + batch].permute(0, 3, 1, 2).float() / 255.0
        x = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
        with torch.no_grad():
            out.append(model(x.to(device)).float().cpu())
    return torch.cat(out)


def concurrent_check(url, name, precision, images, want, concurrency, requests):
    """`requests` requests of 1-8 of `images`, `concurrency` at once; each answer against the
    eager logits of its own images. Returns the result's record."""
    rng = random.Random(7)
    picks = [[rng.randrange(len(images)) for _ in range(rng.choice((1, 2, 3, 5, 8)))]
             for _ in range(requests)]

    def one(pick):
        got = infer(url, name, images[pick])
        expected = want[pick]
        if got.shape != expected.shape or not bool(torch.isfinite(got).all()):
            return float("inf"), 0
        err = ((got - expected).norm() / expected.norm()).item()
        return err, int((got.argmax(1) == expected.argmax(1)).sum())

    errors, top1, failures = [], 0, 0
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for result in pool.map(lambda p: _guard(one, p), picks):
            if result is None:
                failures += 1
                continue
            errors.append(result[0])
            top1 += result[1]
    bound = BOUND[precision]
    over = sum(e >= bound for e in errors)
    images_sent = sum(len(p) for p in picks)
    agreement = top1 / images_sent
    worst = max(errors) if errors else float("nan")
    passed = failures == 0 and over == 0 and agreement >= 0.9
    print(f"gpu_agreement: {name} ({precision}) under {concurrency} concurrent requests: "
          f"{requests} requests ({images_sent} images), {failures} failed, {over} over the bound "
          f"(worst relative error {worst:.2e}), top-1 agreement {agreement:.3f}: "
          f"{'ok' if passed else 'FAILED'}")
    return {"model": name, "precision": precision, "concurrency": concurrency,
            "requests": requests, "failed_requests": failures, "over_bound": over,
            "worst_relative_error": worst, "top1_agreement": agreement, "bound": bound,
            "passed": passed}


def _guard(fn, arg):
    try:
        return fn(arg)
    except Exception as e:  # noqa: BLE001 - counted as a failed request, and the check fails
        print(f"gpu_agreement: a request failed: {e}")
        return None


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--models", nargs="+", required=True, help="NAME:PRECISION")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=0,
                        help="then each model under this many concurrent requests (0: not)")
    parser.add_argument("--requests", type=int, default=1024)
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
    if args.concurrency > 0:
        pool = torch.randint(0, 256, (256, 224, 224, 3), dtype=torch.uint8, generator=generator)
        pool_want = eager_logits(model, pool, device)
        for item in args.models:
            name, precision = item.split(":")
            record = concurrent_check(args.url, name, precision, pool, pool_want,
                                      args.concurrency, args.requests)
            ok &= record["passed"]
            results.append(record)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
