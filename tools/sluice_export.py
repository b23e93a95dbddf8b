"""How Sluice turns a PyTorch nn.Module into the files it serves (used by export_models.py and by
users' own scripts: README, "Serving your own model").

  model.pt        TorchScript (torch.jit.script), for the torchscript backend.
  model.pt2       AOTInductor package (torch.export with a dynamic batch dimension, then
                  torch._inductor.aoti_compile_and_package with freezing), fp32.
  model_bf16.pt2  the same model in bf16: the weights converted, fp32 in and out (the casts fuse
                  into the first and last kernels).
  model_int8.pt2  PT2E static quantisation for x86 (X86InductorQuantizer, now in torchao),
                  calibrated on the images given, then compiled the same way.

The packages are compiled for the CPU that exports them (-march=native), with kernels that take
the serving thread's OpenMP budget (cpp.dynamic_threads), linked against nothing but what the
serving process already holds (aot_inductor.link_libtorch off: a CPU server then never loads
libtorch_cuda), and record their batch range and precision in their metadata.
"""
import ctypes
import os

import torch

PRECISIONS = ("fp32", "bf16", "int8")


def package_name(precision):
    return "model.pt2" if precision == "fp32" else f"model_{precision}.pt2"


def _batch_dims(model, example_inputs, max_batch_size):
    batch = torch.export.Dim("batch", min=1, max=max_batch_size)
    dims = tuple({0: batch} for _ in example_inputs)
    # A forward(*inputs) takes all inputs as one (variadic) argument.
    return (dims,) if isinstance(model, _Bf16) else dims


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

    graph = torch.export.export(
        model, example_inputs,
        dynamic_shapes=_batch_dims(model, example_inputs, max_batch_size)).module()
    quantizer = xiq.X86InductorQuantizer()
    quantizer.set_global(xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(graph, quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared)


def precision_model(model, precision, example_inputs, calibration=None, max_batch_size=64):
    """The module a package of `precision` is compiled from (fp32 in, fp32 out)."""
    model = model.eval()
    if precision == "fp32":
        return model
    if precision == "bf16":
        import copy
        return _Bf16(copy.deepcopy(model)).eval()
    if precision == "int8":
        if calibration is None:
            raise ValueError("int8 needs calibration inputs")
        return quantize_int8(model, example_inputs, calibration, max_batch_size)
    raise ValueError(f"unknown precision {precision!r} (use {', '.join(PRECISIONS)})")


def export_package(model, example_inputs, path, max_batch_size, precision="fp32"):
    """Compiles `model` (already in `precision`, see precision_model) to an AOTInductor package
    accepting batches of 1..max_batch_size; returns the path."""
    example_inputs = tuple(example_inputs)
    with torch.no_grad():
        program = torch.export.export(
            model, example_inputs, dynamic_shapes=_batch_dims(model, example_inputs, max_batch_size))
        return torch._inductor.aoti_compile_and_package(
            program, package_path=path,
            inductor_configs={
                "freezing": True,
                "cpp.dynamic_threads": True,
                "aot_inductor.link_libtorch": False,
                "aot_inductor.metadata": {"sluice.max_batch_size": str(max_batch_size),
                                          "sluice.precision": precision},
            })


def load_package(path):
    """Loads a package in this Python process (torch._inductor.aoti_load_package). Packages built
    without linking libtorch find its symbols in the process's global scope, where Python's
    import of torch does not put them: the already loaded libtorch_cpu is promoted first."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    return torch._inductor.aoti_load_package(path)
