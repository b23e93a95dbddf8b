#!/usr/bin/env python3
"""Writes a Sluice model repository with the PyTorch 2 of the project's .venv (requirements.txt).

Default models (for the demo and benchmarks):
  resnet18       torchvision architecture, seeded random weights (no weights can be downloaded),
                 3x224x224 input with ImageNet normalisation, 1000 logits.
  fashion_mnist  a small CNN trained on Debian's dataset-fashion-mnist IDX files; its test accuracy
                 is recorded in models/fashion_mnist/training.json.

Test models (--test, generated in seconds for the test suite):
  tiny_cnn       3x16x16 -> 5 logits, random weights.
  multi_io       two FP32 inputs of 4 -> (sum, product) as two outputs.
  identity       16 floats -> the same 16 floats.
  faulty         2 floats -> doubled; raises on the marker value -12345 (fault-injection tests).
  busy           16 floats -> 16 floats through 40 dense 256x256 layers, 5 times over: a fixed
                 cost per sample, a few milliseconds (overload tests).
  tiny_cnn_aot   tiny_cnn's weights as AOTInductor packages (fp32, bf16, int8) beside model.pt,
                 with no backend in its config (inferred: the package).

Each default model gets model.pt (TorchScript) and AOTInductor packages (tools/sluice_export.py):
model.pt2 (fp32), model_bf16.pt2 and model_int8.pt2 (PT2E static quantisation, calibrated on
Fashion-MNIST training images for fashion_mnist and, labelled as such in its config, on synthetic
natural images for resnet18). Its config.yaml says `precision: auto`: the precision the export
timed fastest on this CPU within the agreement bound with fp32 on a held-out set
(tools/precision_auto.py; the table in precision_auto.json).

Each model gets reference/{input_*.bin,output_*.bin} and reference.yaml from Python, which the
C++ backends' tests reproduce; each bf16 or int8 package also gets reference_<precision>.yaml and
reference_<precision>/, the outputs of the same package run by Python on the same inputs.

GPU (--device cuda, on a machine with a GPU): resnet18_gpu, the same weights for GPU instances
(docs/GPU.md).

Usage: tools/export_models.py --out models [--only NAME ...] [--force] [--isa avx2]
       tools/export_models.py --out models --choose-precision   (measure precision: auto again)
       tools/export_models.py --device cuda --out models
       tools/export_models.py --test --out build/test-models
"""
import argparse
import gzip
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import precision_auto
import sluice_export

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MEAN, FASHION_STD = 0.2860, 0.3530
FASHION_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                  "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def fmt_list(values):
    return "[" + ", ".join(str(v) for v in values) + "]"


# What every resnet18 config says of its output, its image preprocessing and its replies.
RESNET18_OUTPUTS_AND_PREPROCESS = f"""outputs:
  - name: logits
    datatype: FP32
    shape: [1000]
preprocess:
  image:
    resize: 256
    crop: 224
    channels: 3
    mean: {fmt_list(IMAGENET_MEAN)}
    std: {fmt_list(IMAGENET_STD)}
postprocess:
  topk: 5
"""


def write_config(model_dir, text):
    with open(os.path.join(model_dir, "config.yaml"), "w") as f:
        f.write(text)


def write_reference(model_dir, inputs, outputs, suffix=""):
    """Saves named input/output tensors as raw little-endian files plus a YAML index
    (reference{suffix}.yaml, reference{suffix}/)."""
    ref_dir = os.path.join(model_dir, f"reference{suffix}")
    os.makedirs(ref_dir, exist_ok=True)
    lines = []
    for kind, tensors in (("inputs", inputs), ("outputs", outputs)):
        lines.append(f"{kind}:")
        for name, t in tensors:
            array = t.detach().contiguous().numpy()
            file_name = f"{kind[:-1]}_{name}.bin"
            array.astype(array.dtype.newbyteorder("<")).tofile(os.path.join(ref_dir, file_name))
            dtype = {np.float32: "FP32", np.int64: "INT64", np.uint8: "UINT8"}[array.dtype.type]
            lines.append(f"  - name: {name}")
            lines.append(f"    datatype: {dtype}")
            lines.append(f"    shape: {fmt_list(array.shape)}")
            lines.append(f"    file: {file_name}")
    with open(os.path.join(model_dir, f"reference{suffix}.yaml"), "w") as f:
        f.write("\n".join(lines) + "\n")


def export_packages(model, model_dir, example, reference, precisions, max_batch_size,
                    calibration=None, winograd=None):
    """Writes one AOTInductor package per precision, and for bf16 and int8 the outputs the package
    itself gives in Python on the reference inputs. `reference` is ([(input name, tensor)],
    [output names])."""
    reference_inputs, output_names = reference
    for precision in precisions:
        start = time.time()
        compiled = sluice_export.precision_model(model, precision, example, calibration,
                                                 max_batch_size, winograd)
        path = os.path.join(model_dir, sluice_export.package_name(precision))
        sluice_export.export_package(compiled, example, path, max_batch_size, precision)
        try:
            sluice_export.verify_package(path, compiled, [x for _, x in reference_inputs],
                                         precision, max_batch_size)
        except RuntimeError:
            os.remove(path)
            raise
        if precision != "fp32":
            runner = sluice_export.load_package(path)
            with torch.no_grad():
                out = runner(*(x for _, x in reference_inputs))
            outs = out if isinstance(out, (list, tuple)) else [out]
            write_reference(model_dir, reference_inputs, list(zip(output_names, outs)),
                            suffix=f"_{precision}")
        print(f"{os.path.basename(model_dir)}: {os.path.basename(path)} in "
              f"{time.time() - start:.0f} s", flush=True)


def save_scripted(model, model_dir):
    os.makedirs(model_dir, exist_ok=True)
    scripted = torch.jit.script(model.eval())
    scripted.save(os.path.join(model_dir, "model.pt"))
    return scripted


# --- resnet18 on a GPU (--device cuda, run on the GPU machine) ---------------------------------

GPU_MAX_BATCH = 256


def export_resnet18_cuda(out_dir):
    """resnet18_gpu/: the same seeded weights as resnet18 for GPU instances. model.pt
    (TorchScript; the backend moves it to the GPU in the config's precision), model_fp16.pt2 (an
    AOTInductor package compiled for CUDA on this machine: fp16, channels-last input, batch
    1..256), and a config that takes raw UINT8 [224, 224, 3] images and normalises them on the GPU.
    """
    import torchvision
    import torch._inductor
    if not torch.cuda.is_available():
        sys.exit("export_models.py --device cuda: PyTorch finds no CUDA device here")
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=1000).eval()
    model_dir = os.path.join(out_dir, "resnet18_gpu")
    save_scripted(model, model_dir)
    gpu_model = model.cuda().half().to(memory_format=torch.channels_last)
    example = torch.randn(8, 3, 224, 224, device="cuda", dtype=torch.half).contiguous(
        memory_format=torch.channels_last)
    batch = torch.export.Dim("batch", min=1, max=GPU_MAX_BATCH)
    write_config(model_dir, gpu_config())
    start = time.time()
    with torch.no_grad():
        program = torch.export.export(gpu_model, (example,), dynamic_shapes=({0: batch},))
        torch._inductor.aoti_compile_and_package(
            program, package_path=os.path.join(model_dir, "model_fp16.pt2"),
            inductor_configs={"freezing": True, "aot_inductor.metadata": {
                "sluice.max_batch_size": str(GPU_MAX_BATCH), "sluice.precision": "fp16",
                "sluice.channels_last": "1"}})
    # Its outputs are checked against eager where Sluice serves it (tools/gpu_agreement.py).
    print(f"resnet18_gpu: model_fp16.pt2 compiled for CUDA in {time.time() - start:.0f} s")
    print(f"resnet18_gpu: written to {model_dir}")


def gpu_config(precision="fp16", backend="torchscript", cuda_graphs=True, count=1):
    return f"""# ResNet-18 (seeded random weights) on a GPU: raw UINT8 [224, 224, 3] images in (the binary
# v2 extension sends them as bytes; /predict and /predictions resize and crop a PNG or JPEG to
# them), normalised on the GPU; {precision}, channels-last.
backend: {backend}
max_batch_size: {GPU_MAX_BATCH}
dynamic_batching:
  max_queue_delay_us: 500
  max_queue_size: 8192
instance_group:
  - kind: KIND_GPU
    count: {count}
    gpus: [0]
precision: {precision}
optimize:
  freeze: true
  channels_last: true
  cuda_graphs: {"true" if cuda_graphs else "false"}
inputs:
  - name: input
    datatype: UINT8
    shape: [224, 224, 3]
{RESNET18_OUTPUTS_AND_PREPROCESS}warmup:
  batch_sizes: [1, {GPU_MAX_BATCH}]
"""


# --- resnet18 --------------------------------------------------------------------------------

# Seeds of the synthetic natural images (precision_auto.natural_images): the BatchNorm statistics,
# int8's calibration and the held-out set precision: auto is judged on are three different sets.
RESNET18_BN_SEED, RESNET18_CALIBRATION_SEED, RESNET18_HELD_OUT_SEED = 100, 200, 300
RESNET18_HELD_OUT_IMAGES = 512


def resnet18_natural_images(count, seed):
    return precision_auto.natural_images(count, 224, IMAGENET_MEAN, IMAGENET_STD, seed)


def export_resnet18(out_dir):
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=1000)
    # BatchNorm's running statistics measured on synthetic natural images: with the initial ones
    # (mean 0, variance 1) the random network gives every image the same class, and agreement
    # between precisions would be trivially perfect.
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # A cumulative average over the batches below.
    model.train()
    with torch.no_grad():
        for i in range(4):
            model(resnet18_natural_images(32, RESNET18_BN_SEED + i))
    model.eval()
    model_dir = os.path.join(out_dir, "resnet18")
    scripted = save_scripted(model, model_dir)
    write_config(model_dir, f"""# ResNet-18 (torchvision architecture, seeded random weights, BatchNorm statistics from
# synthetic natural images). Serves the AOTInductor package of `precision`: model.pt2 (fp32),
# model_bf16.pt2, or model_int8.pt2 (calibrated on synthetic natural images, as no real ones
# can be downloaded); `precision: auto` is the one the export measured fastest within the
# agreement bound (precision_auto.json). model.pt (TorchScript) is there too: backend:
# torchscript serves it.
backend: aotinductor
max_batch_size: 64
dynamic_batching:
  max_queue_delay_us: 2000
  max_queue_size: 1024
instances:  # two instances on one pool of the cores: a request alone gets them all, two batches
  count: 2  # at once run side by side on half each
  share_cores: true
  device: cpu
precision: fp32
optimize:
  freeze: false
  channels_last: true
inputs:
  - name: input
    datatype: FP32
    shape: [3, 224, 224]
{RESNET18_OUTPUTS_AND_PREPROCESS}warmup:
  batch_sizes: [1]
""")
    torch.manual_seed(1)
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        y = scripted(x)
    write_reference(model_dir, [("input", x)], [("logits", y)])
    export_resnet18_packages(model, model_dir, x)
    print(f"resnet18: written to {model_dir}")


def export_resnet18_packages(model, model_dir, reference_x):
    calibration = [(resnet18_natural_images(16, RESNET18_CALIBRATION_SEED + i),)
                   for i in range(4)]
    generator = torch.Generator().manual_seed(2)
    export_packages(model.eval(), model_dir, (torch.randn(2, 3, 224, 224, generator=generator),),
                    ([("input", reference_x)], ["logits"]), sluice_export.PRECISIONS, 64,
                    calibration)
    choose_precision(model_dir, "resnet18")


def choose_precision(model_dir, name):
    """precision: auto's measurement on the packages in `model_dir` (tools/precision_auto.py)."""
    if name == "resnet18":
        precision_auto.select(model_dir,
                              resnet18_natural_images(RESNET18_HELD_OUT_IMAGES,
                                                      RESNET18_HELD_OUT_SEED),
                              "held-out synthetic natural images",
                              [1 / 255 / s for s in IMAGENET_STD])
    else:
        test_x, test_y = load_fashion("test")
        precision_auto.select(model_dir, test_x, "Fashion-MNIST test images",
                              [1 / 255 / FASHION_STD], labels=test_y)


# --- fashion_mnist ---------------------------------------------------------------------------

class FashionCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return self.fc2(x)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic = int.from_bytes(data[0:4], "big")
    ndim = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_fashion(split):
    prefix = "train" if split == "train" else "t10k"
    images = read_idx(os.path.join(FASHION_DIR, f"{prefix}-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(FASHION_DIR, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    return (x - FASHION_MEAN) / FASHION_STD, torch.from_numpy(labels.astype(np.int64))


def accuracy(model, x, y):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    return correct / len(x)


# fashion_mnist's tensors, image preprocessing and top 5, for both of its configs.
FASHION_IO = f"""inputs:
  - name: input
    datatype: FP32
    shape: [1, 28, 28]
outputs:
  - name: logits
    datatype: FP32
    shape: [10]
preprocess:
  image:
    resize: 28
    crop: 28
    channels: 1
    mean: [{FASHION_MEAN}]
    std: [{FASHION_STD}]
postprocess:
  topk: 5
"""


def write_fashion_labels(model_dir):
    with open(os.path.join(model_dir, "labels.txt"), "w") as f:
        f.write("\n".join(FASHION_LABELS) + "\n")


def export_test_fashion(model_dir):
    torch.manual_seed(0)
    train_x, train_y = load_fashion("train")
    test_x, test_y = load_fashion("test")
    model = FashionCnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)
    model.train()
    for i in range(0, 12000, 100):
        optimizer.zero_grad()
        F.cross_entropy(model(train_x[i:i + 100]), train_y[i:i + 100]).backward()
        optimizer.step()
    acc = accuracy(model, test_x[:2000], test_y[:2000])
    scripted = save_scripted(model, model_dir)
    write_config(model_dir, f"""# fashion_mnist's network briefly trained (test accuracy {acc:.3f} on 2,000 images).
backend: torchscript
max_batch_size: 16
instances:
  count: 1
  threads: 1
""" + FASHION_IO)
    write_fashion_labels(model_dir)
    x = test_x[:4]
    with torch.no_grad():
        write_reference(model_dir, [("input", x)], [("logits", scripted(x))])


def export_fashion_mnist(out_dir, epochs):
    torch.manual_seed(0)
    train_x, train_y = load_fashion("train")
    test_x, test_y = load_fashion("test")
    model = FashionCnn()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = time.time()
    for epoch in range(epochs):
        model.train()
        order = torch.randperm(len(train_x))
        for i in range(0, len(order), 128):
            idx = order[i:i + 128]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
            loss.backward()
            optimizer.step()
        print(f"fashion_mnist: epoch {epoch + 1}/{epochs} test accuracy "
              f"{accuracy(model, test_x, test_y):.4f} ({time.time() - start:.0f} s)", flush=True)
    acc = accuracy(model, test_x, test_y)
    if acc < 0.88:
        sys.exit(f"fashion_mnist: test accuracy {acc:.4f} is below 0.88")
    model_dir = os.path.join(out_dir, "fashion_mnist")
    scripted = save_scripted(model, model_dir)
    write_config(model_dir, f"""# Small CNN trained on Fashion-MNIST (28x28 grey images, 10 classes).
# Serves the AOTInductor package of `precision`: model.pt2 (fp32), model_bf16.pt2, or
# model_int8.pt2 (calibrated on 2,048 Fashion-MNIST training images); `precision: auto` is the
# one the export measured fastest within the agreement bound (precision_auto.json). model.pt
# (TorchScript) is there too: backend: torchscript serves it.
backend: aotinductor
max_batch_size: 64
dynamic_batching:
  max_queue_delay_us: 2000
  preferred_batch_sizes: [32, 64]
  max_queue_size: 4096
instances:
  count: 2
  device: cpu
  threads: 1
optimize:
  freeze: true
precision: fp32
""" + FASHION_IO)
    write_fashion_labels(model_dir)
    with open(os.path.join(model_dir, "training.json"), "w") as f:
        json.dump({"dataset": "Fashion-MNIST (Debian dataset-fashion-mnist)",
                   "test_images": len(test_x), "test_accuracy": round(acc, 4),
                   "epochs": epochs, "seed": 0, "train_seconds": round(time.time() - start, 1),
                   "torch": torch.__version__}, f, indent=2)
        f.write("\n")
    x = test_x[:8]
    with torch.no_grad():
        y = scripted(x)
    write_reference(model_dir, [("input", x)], [("logits", y)])
    export_fashion_packages(model, model_dir, train_x, x)
    print(f"fashion_mnist: test accuracy {acc:.4f}, written to {model_dir}")


def export_packages_only(out_dir, name):
    """Recompiles a default model's packages from its model.pt, on the same calibration data."""
    model_dir = os.path.join(out_dir, name)
    scripted = torch.jit.load(os.path.join(model_dir, "model.pt"))
    if name == "resnet18":
        import torchvision
        model = torchvision.models.resnet18(weights=None, num_classes=1000)
    else:
        model = FashionCnn()
    model.load_state_dict(scripted.state_dict())
    model.eval()
    x = read_reference_input(model_dir)
    if name == "resnet18":
        export_resnet18_packages(model, model_dir, x)
    else:
        train_x, _ = load_fashion("train")
        export_fashion_packages(model, model_dir, train_x, x)


def read_reference_input(model_dir):
    with open(os.path.join(model_dir, "reference.yaml")) as f:
        lines = f.read().splitlines()
    shape = [int(v) for v in lines[3].split("[", 1)[1].rstrip("]").split(",")]
    data = np.fromfile(os.path.join(model_dir, "reference", "input_input.bin"), dtype="<f4")
    return torch.from_numpy(data.reshape(shape).copy())


def export_fashion_packages(model, model_dir, train_x, reference_x):
    # Calibrated on real training images (the first 2,048 of a fixed shuffle), never on test ones.
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(3))[:2048]
    calibration = [(train_x[order[i:i + 64]],) for i in range(0, len(order), 64)]
    export_packages(model.eval(), model_dir, (train_x[:2],), ([("input", reference_x)], ["logits"]),
                    sluice_export.PRECISIONS, 64, calibration)
    choose_precision(model_dir, "fashion_mnist")


# --- test models -----------------------------------------------------------------------------

class TinyCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = F.adaptive_avg_pool2d(F.relu(self.conv(x)), 4)
        return self.fc(torch.flatten(x, 1))


class TinyResidual(nn.Module):
    """A ResNet basic block between a stem and a classifier: two 3x3 stride-1 convolutions with
    BatchNorm, the second ending in a residual addition and ReLU (what the fp32 export gives to
    sluice::conv3x3), and a stem convolution it leaves alone (3 input channels)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.conv1, self.bn1 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.conv2, self.bn2 = nn.Conv2d(16, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, 5)
        for bn in (self.bn1, self.bn2):
            nn.init.uniform_(bn.weight, 0.5, 1.5)
            nn.init.uniform_(bn.bias, -0.2, 0.2)
            nn.init.uniform_(bn.running_mean, -0.2, 0.2)
            nn.init.uniform_(bn.running_var, 0.5, 2.0)

    def forward(self, x):
        x = F.relu(self.stem(x))
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)) + x)
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))


class MultiIo(nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor):
        return a + b, a * b


class Identity(nn.Module):
    def forward(self, x):
        return x.clone()


class Faulty(nn.Module):
    """Doubles its input, but fails the whole call when any value is the marker -12345."""

    def forward(self, x):
        if bool((x == -12345.0).any()):
            raise RuntimeError("marker input")
        return x * 2


class Busy(nn.Module):
    """A fixed amount of arithmetic per sample (about 13 M multiply-adds)."""

    def __init__(self, layers=40, width=256, passes=5):
        super().__init__()
        self.inp = nn.Linear(16, width)
        self.hidden = nn.ModuleList([nn.Linear(width, width) for _ in range(layers)])
        self.out = nn.Linear(width, 16)
        self.passes = passes

    def forward(self, x):
        h = self.inp(x)
        for _ in range(self.passes):
            for layer in self.hidden:
                h = torch.tanh(layer(h))
        return self.out(h)


def simple_config(inputs, outputs, max_batch_size=8, extra=""):
    def specs(items):
        return "".join(f"  - name: {n}\n    datatype: FP32\n    shape: {fmt_list(s)}\n" for n, s in items)
    return (f"max_batch_size: {max_batch_size}\ninstances:\n  count: 1\n  threads: 1\n"
            f"inputs:\n{specs(inputs)}outputs:\n{specs(outputs)}{extra}")


def export_test_models(out_dir):
    torch.manual_seed(0)
    d = os.path.join(out_dir, "tiny_cnn")
    tiny = TinyCnn()
    m = save_scripted(tiny, d)
    write_config(d, simple_config([("input", [3, 16, 16])], [("logits", [5])],
                                  extra="warmup:\n  batch_sizes: [1, 4]\n"))
    x = torch.randn(4, 3, 16, 16)
    with torch.no_grad():
        write_reference(d, [("input", x)], [("logits", m(x))])

    # The same weights as AOTInductor packages beside model.pt; no backend in the config, so the
    # packages are inferred. Calibrated on random inputs.
    d = os.path.join(out_dir, "tiny_cnn_aot")
    save_scripted(m, d)
    write_config(d, simple_config([("input", [3, 16, 16])], [("logits", [5])],
                                  extra="warmup:\n  batch_sizes: [1, 4]\n"))
    with torch.no_grad():
        write_reference(d, [("input", x)], [("logits", m(x))])
    calibration = [(torch.randn(8, 3, 16, 16),) for _ in range(8)]
    export_packages(tiny, d, (torch.randn(2, 3, 16, 16),), ([("input", x)], ["logits"]),
                    sluice_export.PRECISIONS, 8, calibration)

    # fp32 only: its package calls sluice::conv3x3 (on every CPU; where the library is built), and
    # the reference is the eager model's, so Sluice's run of it checks the operator end to end.
    d = os.path.join(out_dir, "tiny_residual_aot")
    residual = TinyResidual().eval()
    save_scripted(residual, d)
    write_config(d, simple_config([("input", [3, 10, 10])], [("logits", [5])], max_batch_size=4))
    x = torch.randn(3, 3, 10, 10)
    with torch.no_grad():
        write_reference(d, [("input", x)], [("logits", residual(x))])
    export_packages(residual, d, (torch.randn(2, 3, 10, 10),), ([("input", x)], ["logits"]),
                    ("fp32",), 4, winograd=True)

    d = os.path.join(out_dir, "multi_io")
    m = save_scripted(MultiIo(), d)
    write_config(d, simple_config([("a", [4]), ("b", [4])], [("sum", [4]), ("product", [4])]))
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    with torch.no_grad():
        s, p = m(a, b)
    write_reference(d, [("a", a), ("b", b)], [("sum", s), ("product", p)])

    d = os.path.join(out_dir, "identity")
    m = save_scripted(Identity(), d)
    write_config(d, simple_config([("input", [16])], [("output", [16])], max_batch_size=64))
    x = torch.randn(2, 16)
    write_reference(d, [("input", x)], [("output", m(x))])

    # Batches go when 4 requests are in (or after 0.5 s), so concurrent requests share a batch.
    d = os.path.join(out_dir, "faulty")
    m = save_scripted(Faulty(), d)
    write_config(d, simple_config([("input", [2])], [("output", [2])], extra=(
        "dynamic_batching:\n  max_queue_delay_us: 500000\n  preferred_batch_sizes: [4]\n")))
    x = torch.randn(2, 2)
    write_reference(d, [("input", x)], [("output", m(x))])

    # fashion_mnist's network, trained briefly (one pass over 12,000 images; about 85% test
    # accuracy): an image classifier with labels and image preprocessing, for tests that drop a
    # real Fashion-MNIST picture on it (the console's).
    export_test_fashion(os.path.join(out_dir, "fashion_mnist"))

    d = os.path.join(out_dir, "busy")
    m = save_scripted(Busy(), d)
    write_config(d, simple_config([("input", [16])], [("output", [16])], max_batch_size=1))
    x = torch.randn(2, 16)
    with torch.no_grad():
        write_reference(d, [("input", x)], [("output", m(x))])
    print(f"test models: written to {out_dir}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="models", help="model repository to write")
    parser.add_argument("--test", action="store_true", help="write the tiny test models instead")
    parser.add_argument("--only", nargs="*", choices=["resnet18", "fashion_mnist"],
                        help="default models to write (default: both)")
    parser.add_argument("--force", action="store_true", help="rewrite models that exist")
    parser.add_argument("--epochs", type=int, default=3, help="fashion_mnist training epochs")
    parser.add_argument("--packages-only", action="store_true",
                        help="rewrite only the AOTInductor packages (and their references) from "
                             "the existing model.pt: packages are compiled for the exporting CPU, "
                             "so a repository moved to another machine needs this")
    parser.add_argument("--choose-precision", action="store_true",
                        help="only measure the existing packages again and rewrite precision: "
                             "auto's choice (config.yaml, precision_auto.json)")
    parser.add_argument("--isa", choices=sorted(sluice_export.TARGET_ISAS), default="native",
                        help="instruction set the packages are compiled for: native (this CPU), "
                             "or avx2 / avx512 for any x86-64 CPU with them (images, clusters)")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                        help="cuda: write resnet18_gpu (TorchScript and an AOTInductor package "
                             "compiled for this machine's GPU); needs a CUDA device")
    args = parser.parse_args()
    if args.device == "cuda":
        os.makedirs(args.out, exist_ok=True)
        export_resnet18_cuda(args.out)
        return
    sluice_export.set_target_isa(args.isa)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    if args.test:
        export_test_models(args.out)
        return
    for name in args.only or ["resnet18", "fashion_mnist"]:
        if args.choose_precision:
            choose_precision(os.path.join(args.out, name), name)
            continue
        if args.packages_only:
            export_packages_only(args.out, name)
            continue
        if not args.force and os.path.exists(os.path.join(args.out, name, "model.pt")):
            print(f"{name}: exists in {args.out}, skipped (use --force to rewrite)")
            continue
        if name == "resnet18":
            export_resnet18(args.out)
        else:
            export_fashion_mnist(args.out, args.epochs)


if __name__ == "__main__":
    main()
