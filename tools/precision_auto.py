"""`precision: auto` for exported vision models: every precision this CPU runs natively is timed
and checked against fp32 on a held-out set, and the fastest one within the bound is written into
the model's config (precision: auto, precision_auto.chosen), with the whole table in
precision_auto.json beside it.

Candidates: fp32 always; int8 (PT2E static) always, as every x86-64 CPU has integer dot products
(VNNI makes them faster); bf16 only where the CPU has AVX-512 BF16 or AMX (elsewhere it is
emulated in fp32 arithmetic and 2-10x slower, so never the fastest).

Bound: top-1 agreement with fp32 >= 99% on the held-out images, or, when it is lower, fp32's own
top-1 agreement with itself when every input pixel moves by up to one 8-bit step (uniform noise of
+-1/255 before normalisation: less than two correct resize implementations, or a JPEG re-encoding,
differ by). A model whose answers flip that often under noise no eye sees cannot hold another
precision to 99%: its top classes are near-ties (resnet18's random weights), and the precision is
then held to fp32's own stability instead. Where the images are labelled, accuracy also at most
0.5 points below fp32's. A precision outside the bound is never chosen, however fast. Speed: samples/s of the package itself (tools/sluice_export.py's PackageRunner, the batch
buckets Sluice runs) at batch 8, medians of interleaved rounds.

Held-out sets: Fashion-MNIST's 10,000 test images (labelled) for fashion_mnist; for resnet18,
whose weights are random (no ImageNet weights can be downloaded), natural_images() with a seed
of their own: never the images int8 was calibrated on.
"""
import json
import math
import os
import re
import statistics
import time

import torch

import sluice_export

TOP1_AGREEMENT_MIN = 0.99
ACCURACY_DROP_MAX = 0.005
TIMING_BATCH = 8


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def candidate_precisions(flags=None):
    """The precisions worth timing on a CPU with `flags` (/proc/cpuinfo's)."""
    flags = cpu_flags() if flags is None else flags
    native_bf16 = bool(flags & {"avx512_bf16", "amx_bf16"})
    return ["fp32", "int8"] + (["bf16"] if native_bf16 else [])


def natural_images(count, size, mean, std, seed):
    """`count` RGB images of size x size that look like photographs to a convolution's statistics,
    normalised with `mean`/`std`: a 1/f amplitude spectrum (natural images' power falls as 1/f^2)
    per channel with correlated colour, plus a few flat-coloured ellipses and rectangles with hard
    edges, lit by a smooth gradient. Deterministic in `seed`."""
    g = torch.Generator().manual_seed(seed)
    fy = torch.fft.fftfreq(size).reshape(-1, 1)
    fx = torch.fft.rfftfreq(size).reshape(1, -1)
    amplitude = 1.0 / torch.clamp(torch.sqrt(fx * fx + fy * fy), min=1.0 / size)
    yy, xx = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size),
                            indexing="ij")
    images = torch.empty(count, 3, size, size)
    for i in range(count):
        phase = torch.rand(size, size // 2 + 1, generator=g) * 2 * math.pi
        base = torch.fft.irfft2(amplitude * torch.exp(1j * phase), s=(size, size))
        base = (base - base.mean()) / (base.std() + 1e-6)
        tint = torch.rand(3, generator=g) * 0.6 + 0.2
        img = tint.reshape(3, 1, 1) + 0.12 * base.unsqueeze(0) * (
            0.6 + 0.4 * torch.rand(3, 1, 1, generator=g))
        for _ in range(int(torch.randint(2, 7, (1,), generator=g))):
            cy, cx = (torch.rand(2, generator=g) * 2 - 1).tolist()
            ry, rx = (torch.rand(2, generator=g) * 0.5 + 0.08).tolist()
            if torch.rand(1, generator=g).item() < 0.5:
                mask = ((yy - cy) / ry) ** 2 + ((xx - cx) / rx) ** 2 <= 1
            else:
                mask = ((yy - cy).abs() <= ry) & ((xx - cx).abs() <= rx)
            colour = torch.rand(3, 1, 1, generator=g)
            img = torch.where(mask.unsqueeze(0), colour + 0.05 * base.unsqueeze(0), img)
        angle = torch.rand(1, generator=g).item() * 2 * math.pi
        light = 0.8 + 0.3 * (math.cos(angle) * xx + math.sin(angle) * yy)
        img = (img * light).clamp(0, 1)
        images[i] = img
    m = torch.tensor(mean).reshape(1, 3, 1, 1)
    s = torch.tensor(std).reshape(1, 3, 1, 1)
    return (images - m) / s


def _outputs(runner, images, batch=64):
    outs = []
    with torch.no_grad():
        for i in range(0, len(images), batch):
            outs.append(runner(images[i:i + batch]).float())
    return torch.cat(outs)


def _time(runner, example):
    x = sluice_export._resize_batch(example, TIMING_BATCH)
    with torch.no_grad():
        runner(x)
        start = time.perf_counter()
        calls = 0
        while calls < 3 or time.perf_counter() - start < 1.0:
            runner(x)
            calls += 1
    return TIMING_BATCH * calls / (time.perf_counter() - start)


def noise_agreement(runner, held_out, reference_top1, pixel_step, seed=5):
    """fp32's top-1 agreement with itself when each input value moves by up to one pixel step
    (`pixel_step`: one 8-bit step in normalised units, per channel)."""
    g = torch.Generator().manual_seed(seed)
    step = torch.tensor(pixel_step, dtype=torch.float32).reshape(1, -1, 1, 1)
    noisy = held_out + (torch.rand(held_out.shape, generator=g) * 2 - 1) * step
    return (_outputs(runner, noisy).argmax(1) == reference_top1).float().mean().item()


def measure(model_dir, precisions, held_out, pixel_step, labels=None, rounds=3):
    """Times each precision's package and compares its outputs on `held_out` with fp32's.
    Returns a list of dicts, one per precision (fp32 first), and a dict of the set's figures:
    how many distinct classes fp32 puts first (a set on which every image gets one class would
    agree trivially), fp32's agreement under one pixel step of noise, and the top-1 agreement
    required of the others."""
    runners = {p: sluice_export.load_package(os.path.join(model_dir,
                                                          sluice_export.package_name(p)))
               for p in precisions}
    speeds = {p: [] for p in precisions}
    order = list(precisions)
    for r in range(rounds):  # A B C, C B A, ...: drift falls on every precision alike.
        for p in (order if r % 2 == 0 else order[::-1]):
            speeds[p].append(_time(runners[p], held_out[:1]))
    reference = _outputs(runners["fp32"], held_out)
    ref_top1 = reference.argmax(1)
    rows = []
    for p in precisions:
        out = reference if p == "fp32" else _outputs(runners[p], held_out)
        top1 = out.argmax(1)
        k = min(5, out.shape[1])
        top5 = out.topk(k, dim=1).indices
        row = {
            "precision": p,
            "samples_per_s": round(statistics.median(speeds[p]), 2),
            "top1_agreement": round((top1 == ref_top1).float().mean().item(), 4),
            "top5_agreement": round((top5 == ref_top1.unsqueeze(1)).any(1).float().mean().item(),
                                    4),
            "max_error_of_scale": round(((out - reference).abs().max() /
                                         reference.abs().max().clamp(min=1e-6)).item(), 5),
        }
        if labels is not None:
            row["accuracy"] = round((top1 == labels).float().mean().item(), 4)
        rows.append(row)
    floor = noise_agreement(runners["fp32"], held_out, ref_top1, pixel_step)
    required = min(TOP1_AGREEMENT_MIN, round(floor, 4))
    extra = {}
    scripted = os.path.join(model_dir, "model.pt")
    if os.path.isfile(scripted):
        # The fp32 package against the eager TorchScript model (oneDNN's direct convolutions):
        # what Inductor's fusions and sluice::conv3x3's Winograd transforms change.
        eager = _outputs(torch.jit.load(scripted).eval(), held_out)
        extra["fp32_package_vs_model_pt"] = {
            "top1_agreement": round((eager.argmax(1) == ref_top1).float().mean().item(), 4),
            "max_error_of_scale": round(((eager - reference).abs().max() /
                                         eager.abs().max().clamp(min=1e-6)).item(), 7)}
    base = rows[0]
    for row in rows:
        row["speed_vs_fp32"] = round(row["samples_per_s"] / base["samples_per_s"], 3)
        drop = base["accuracy"] - row["accuracy"] if labels is not None else 0.0
        row["within_bound"] = (row["top1_agreement"] >= required and
                               drop <= ACCURACY_DROP_MAX + 1e-9)
    return rows, {"distinct_fp32_top1_classes": len(set(ref_top1.tolist())),
                  "fp32_top1_agreement_under_pixel_noise": round(floor, 4),
                  "top1_agreement_required": required, **extra}


def choose(rows):
    """The fastest row within the bound (fp32 always is)."""
    return max((r for r in rows if r["within_bound"]), key=lambda r: r["samples_per_s"])


def note_of(row, held_out_name, count, figures):
    text = (f"{row['precision']}: {row['speed_vs_fp32']:.2f}x fp32's samples/s at batch "
            f"{TIMING_BATCH}, top-1 agreement {100 * row['top1_agreement']:.1f}% on {count:,} "
            f"{held_out_name} (required "
            f"{100 * figures['top1_agreement_required']:.1f}%; fp32 under one pixel step of "
            f"noise: {100 * figures['fp32_top1_agreement_under_pixel_noise']:.1f}%)")
    if "accuracy" in row:
        text += f", accuracy {100 * row['accuracy']:.2f}%"
    return text + f", measured on {cpu_name()}"


def replace_precision(config_text, block, source):
    """`config_text` (a config.yaml) with its `precision:` line, and the precision_auto record
    under it if any, replaced by `block` (e.g. "precision: int8\n" to pin one)."""
    text, n = re.subn(r"^precision: \w+\n(precision_auto:.*\n(  .*\n)*)?", block, config_text,
                      flags=re.M)
    if n != 1:
        raise RuntimeError(f"{source}: no single `precision:` line to replace")
    return text


def select(model_dir, held_out, held_out_name, pixel_step, labels=None, precisions=None):
    """Measures, chooses, writes precision_auto.json and puts the choice into config.yaml (its
    `precision:` line becomes `precision: auto` with precision_auto under it). `pixel_step`:
    one 8-bit pixel step in the held-out tensors' normalised units, per channel. Returns the
    chosen precision."""
    precisions = precisions or candidate_precisions()
    rows, figures = measure(model_dir, precisions, held_out, pixel_step, labels)
    chosen = choose(rows)
    note = note_of(chosen, held_out_name, len(held_out), figures)
    with open(os.path.join(model_dir, "precision_auto.json"), "w") as f:
        json.dump({"chosen": chosen["precision"], "note": note, "cpu": cpu_name(),
                   "bound": {"top1_agreement_min": TOP1_AGREEMENT_MIN,
                             "accuracy_drop_max": ACCURACY_DROP_MAX if labels is not None
                             else None},
                   "held_out": {"images": len(held_out), "what": held_out_name, **figures},
                   "timing_batch": TIMING_BATCH, "candidates": rows}, f, indent=2)
        f.write("\n")
    path = os.path.join(model_dir, "config.yaml")
    with open(path) as f:
        text = f.read()
    block = (f"precision: auto\nprecision_auto:  # measured at export: precision_auto.json\n"
             f"  chosen: {chosen['precision']}\n  note: {json.dumps(note)}\n")
    with open(path, "w") as f:
        f.write(replace_precision(text, block, path))
    for row in rows:
        print(f"{os.path.basename(model_dir)}: {row['precision']}: {row['samples_per_s']} "
              f"samples/s at batch {TIMING_BATCH} ({row['speed_vs_fp32']}x fp32), top-1 "
              f"agreement {row['top1_agreement']}, top-5 {row['top5_agreement']}"
              + (f", accuracy {row['accuracy']}" if "accuracy" in row else "")
              + ("" if row["within_bound"] else " (outside the bound)"), flush=True)
    print(f"{os.path.basename(model_dir)}: precision auto chose {chosen['precision']}", flush=True)
    return chosen["precision"]
