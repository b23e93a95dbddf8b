"""How Sluice turns a PyTorch nn.Module into the files it serves (used by export_models.py and by
users' own scripts: README, "Serving your own model").

  model.pt        TorchScript (torch.jit.script), for the torchscript backend.
  model.pt2       AOTInductor package (torch.export, then torch._inductor.aot_compile with
                  freezing), fp32; its 3x3 stride-1 convolutions call Sluice's Winograd
                  operator where libsluice_torch_ops.so is built (winograd_rewrite.py).
  model_bf16.pt2  the same model in bf16: the weights converted, fp32 in and out (the casts fuse
                  into the first and last kernels).
  model_int8.pt2  PT2E static quantisation for x86 (X86InductorQuantizer, now in torchao),
                  calibrated on the images given, then compiled the same way.

Each package holds one model per batch bucket (1, 2, 4, ... up to the maximum), each exported
with a static batch, and Sluice pads a batch up to the next bucket. A single model with a dynamic
batch dimension (what the README's five lines make, and what Sluice also serves) is both slower
and, in int8, wrong on Inductor 2.11: its oneDNN convolutions cannot be prepacked for a known
input size, which made fashion_mnist 3.6x slower (5.2k against 18.9k samples/s at batch 64 on 2
AMD EPYC cores), and its frozen int8 convolutions and linears are miscompiled (outputs off by up
to 100%, while the same graph with a static batch matches eager to 1e-6). The models are named
"model" (the largest bucket) and "bucket_0001", "bucket_0002", ... in one package: the loaders
find a model by name prefix, so no name may be the prefix of another ("b1" would also find
"b16"). Padding costs at most 2x the compute of the batch.

The packages are compiled for the CPU that exports them (-march=native), with kernels that take
the serving thread's OpenMP budget (cpp.dynamic_threads), linked against nothing but what the
serving process already holds (aot_inductor.link_libtorch off: a CPU server then never loads
libtorch_cuda), and record their batch range and precision in their metadata.

set_target_isa("avx2") compiles them for any x86-64 CPU with AVX2 instead (x86-64-v3: AVX2, FMA,
F16C, BMI; Haswell, Zen and later): Inductor's vector kernels at 256 bits and -march=x86-64-v3 in
place of -march=native, so no AVX-512 instruction is emitted even on a machine that has it. The
package records sluice.cpu_isa=avx2, and Sluice refuses it on a CPU without AVX2. For images and
clusters whose nodes differ from the exporting machine (deploy/).
"""
import ctypes
import os

import torch

import winograd_rewrite

PRECISIONS = ("fp32", "bf16", "int8")
TARGET_ISAS = {"native": None, "avx2": ("x86-64-v3", 256), "avx512": ("x86-64-v4", 512)}


_target_isa = "native"


def set_target_isa(isa):
    """Compiles the packages exported from now on for `isa` (see TARGET_ISAS) rather than for this
    CPU. "native" (the default) leaves Inductor's own choice."""
    import torch._inductor.config as inductor_config
    from torch._inductor import cpp_builder
    if isa not in TARGET_ISAS:
        raise ValueError(f"unknown ISA {isa!r}; one of {', '.join(TARGET_ISAS)}")
    if TARGET_ISAS[isa] is None:
        return
    global _target_isa
    _target_isa = isa
    march, simdlen = TARGET_ISAS[isa]
    inductor_config.cpp.simdlen = simdlen
    original = getattr(cpp_builder._get_optimization_cflags, "__wrapped__",
                       cpp_builder._get_optimization_cflags)

    def cflags(*args, **kwargs):
        flags, ldflags = original(*args, **kwargs)
        if "march=native" not in flags:
            raise RuntimeError(f"Inductor's compile flags changed ({flags}); set_target_isa "
                               "cannot replace -march=native")
        return [f"march={march}" if f == "march=native" else f for f in flags], ldflags

    cflags.__wrapped__ = original
    cpp_builder._get_optimization_cflags = cflags


def package_name(precision):
    return "model.pt2" if precision == "fp32" else f"model_{precision}.pt2"


def _batch_dims(example_inputs, max_batch_size):
    batch = torch.export.Dim("batch", min=1, max=max_batch_size)
    return tuple({0: batch} for _ in example_inputs)


class _Bf16(torch.nn.Module):
    """Runs `model` in bf16 between fp32 inputs and fp32 outputs."""

    def __init__(self, model):
        super().__init__()
        self.model = model.to(torch.bfloat16)

    def forward(self, *inputs):
        out = self.model(*(x.to(torch.bfloat16) for x in inputs))
        if isinstance(out, tuple):
            return tuple(o.float() for o in out)
        return out.float()


def quantize_int8(model, example_inputs, calibration, max_batch_size):
    """PT2E static int8 quantisation for x86: per-channel weights, per-tensor activations,
    observed on `calibration` (an iterable of input tuples)."""
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq

    # Strict (TorchDynamo) capture: the quantizer finds convolutions and linears by the
    # source_fn_stack it records on each node, which the default non-strict export leaves out
    # (and then nothing is quantised, silently).
    graph = torch.export.export(
        model, example_inputs, dynamic_shapes=_batch_dims(example_inputs, max_batch_size),
        strict=True).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    converted = convert_pt2e(prepared)
    quantized = [n for n in converted.graph.nodes if "quantize_per" in str(n.target)]
    if not quantized:
        raise RuntimeError("int8: the quantizer annotated no operator of the model")
    return converted


def _winograd_pays():
    """Whether the fp32 package gets sluice::conv3x3: measured faster than oneDNN's direct
    convolutions on AVX2 CPUs (docs/performance-log.md), not measured against oneDNN's AVX-512
    kernels, so packages compiled for AVX-512 keep those. SLUICE_WINOGRAD=on|off decides instead."""
    choice = os.environ.get("SLUICE_WINOGRAD", "auto")
    if choice in ("on", "off"):
        return choice == "on"
    if _target_isa != "native":
        return _target_isa == "avx2"
    from precision_auto import cpu_flags  # Imported here: precision_auto imports this module.
    return "avx512f" not in cpu_flags()


def precision_model(model, precision, example_inputs, calibration=None, max_batch_size=64,
                    winograd=None):
    """The module a package of `precision` is compiled from (fp32 in, fp32 out). In fp32, the 3x3
    stride-1 convolutions run Sluice's Winograd operator where it is built (winograd_rewrite) and
    `winograd` (None: where it pays, _winograd_pays)."""
    model = model.eval()
    if precision == "fp32":
        if not (_winograd_pays() if winograd is None else winograd):
            return model
        rewritten, count = winograd_rewrite.rewrite(model)
        if count:
            print(f"fp32: {count} 3x3 convolutions by Winograd (sluice::conv3x3)", flush=True)
        return rewritten
    if precision == "bf16":
        import copy
        return _Bf16(copy.deepcopy(model)).eval()
    if precision == "int8":
        if calibration is None:
            raise ValueError("int8 needs calibration inputs")
        return quantize_int8(model, example_inputs, calibration, max_batch_size)
    raise ValueError(f"unknown precision {precision!r} (use {', '.join(PRECISIONS)})")


def batch_buckets(max_batch_size):
    """1, 2, 4, ... below max_batch_size, then max_batch_size."""
    buckets, b = [], 1
    while b < max_batch_size:
        buckets.append(b)
        b *= 2
    return buckets + [max_batch_size]


def bucket_model_name(bucket, max_batch_size):
    return "model" if bucket == max_batch_size else f"bucket_{bucket:04d}"


def _inductor_configs(metadata):
    return {"freezing": True, "cpp.dynamic_threads": True, "aot_inductor.link_libtorch": False,
            "aot_inductor.metadata": metadata}


def export_package(model, example_inputs, path, max_batch_size, precision="fp32"):
    """Compiles `model` (already in `precision`, see precision_model) to an AOTInductor package
    accepting batches of 1..max_batch_size, one static model per batch bucket (see the file
    comment); returns the path."""
    from torch._inductor.package import package_aoti
    buckets = batch_buckets(max_batch_size)
    options = _inductor_configs({"sluice.max_batch_size": str(max_batch_size),
                                 "sluice.precision": precision,
                                 "sluice.batch_buckets": ",".join(str(b) for b in buckets),
                                 "sluice.cpu_isa": _target_isa})
    options["aot_inductor.package"] = True
    files = {}
    with torch.no_grad():
        for bucket in buckets:
            inputs = tuple(_resize_batch(x, bucket) for x in example_inputs)
            program = torch.export.export(model, inputs)
            name = bucket_model_name(bucket, max_batch_size)
            files[name] = torch._inductor.aot_compile(program.module(), inputs,
                                                      options=dict(options))
    return package_aoti(path, files)


def verify_package(path, model, inputs, precision, max_batch_size):
    """Runs the package as Sluice will (PackageRunner) and compares it with `model` (the module
    it was compiled from) on `inputs`, resized to batches of 1, 3 and max_batch_size (so every
    path, bucket padding included, is checked): a miscompiled package fails the export instead
    of serving wrong answers (a miscompile shows as 20-100% of the output scale). Tolerance:
    1e-3 of the output scale in fp32; 2% in bf16, where a fused kernel may round at another
    point than eager; 5% in int8, where a fused kernel requantises (one step is 1/127 of a
    tensor's range) at other points than eager's quantize/dequantize pairs, a few steps in all."""
    runner = load_package(path)
    tolerance = {"fp32": 1e-3, "bf16": 2e-2, "int8": 5e-2}[precision]
    for batch in sorted({1, min(3, max_batch_size), max_batch_size}):
        batch_inputs = [_resize_batch(x, batch) for x in inputs]
        with torch.no_grad():
            want = model(*batch_inputs)
            got = runner(*batch_inputs)
        wants = want if isinstance(want, (list, tuple)) else [want]
        gots = got if isinstance(got, (list, tuple)) else [got]
        for w, g in zip(wants, gots):
            scale = max(w.float().abs().max().item(), 1e-6)
            error = (w.float() - g.float()).abs().max().item()
            if g.shape != w.shape or error > tolerance * scale:
                raise RuntimeError(
                    f"{path}: at batch {batch} the compiled package differs from its model by "
                    f"{error:.3g} (output scale {scale:.3g}); not written")


def _resize_batch(x, batch):
    """`x` with `batch` samples: its own, repeated as needed."""
    reps = -(-batch // x.shape[0])
    return x.repeat(reps, *([1] * (x.dim() - 1)))[:batch].contiguous()


class PackageRunner:
    """Runs a package as Sluice does: a dynamic-batch package directly; a bucketed one by
    padding each batch with zeros up to the next bucket and returning the first rows."""

    def __init__(self, path):
        lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
        ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        winograd_rewrite.load_ops()  # An fp32 package may call sluice::conv3x3.
        from torch._inductor.package import load_package as load
        self.runners = {}
        first = load(path, "model")
        buckets = first.get_metadata().get("sluice.batch_buckets", "")
        if not buckets:
            self.runners[None] = first
            return
        sizes = [int(b) for b in buckets.split(",")]
        for bucket in sizes:
            name = bucket_model_name(bucket, max(sizes))
            self.runners[bucket] = first if name == "model" else load(path, name)

    def __call__(self, *inputs):
        if None in self.runners:
            return self.runners[None](*inputs)
        n = inputs[0].shape[0]
        bucket = min(b for b in self.runners if b >= n)
        padded = [torch.cat([x, x.new_zeros((bucket - n, *x.shape[1:]))]) if bucket > n else x
                  for x in inputs]
        out = self.runners[bucket](*padded)
        if isinstance(out, (list, tuple)):
            return type(out)(o[:n] for o in out)
        return out[:n]


def load_package(path):
    """Loads a package in this Python process (torch._inductor.aoti_load_package underneath).
    Packages built without linking libtorch find its symbols in the process's global scope,
    where Python's import of torch does not put them: the already loaded libtorch_cpu is
    promoted first (PackageRunner does it)."""
    return PackageRunner(path)
