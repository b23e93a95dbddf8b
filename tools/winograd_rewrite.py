"""Rewrites a vision model's 3x3 stride-1 convolutions to Sluice's Winograd operator before it is
compiled to an fp32 AOTInductor package.

torch.ops.sluice.conv3x3 (src/backends/winograd/) computes a 3x3, stride-1, padding-1 convolution
by Winograd's F(4x4, 3x3): 4x fewer multiply-adds than the direct convolution oneDNN runs on
CPUs without AVX-512 (where oneDNN has no Winograd); or, in calls with so few output pixels that
reading the transformed weights costs more than the products, by F(2x2, 3x3), whose weights are
16/36 the size. The weights are transformed once per tile size, on the operator's first call
with it (the package keeps the plain weights), and the bias, a residual addition and a ReLU are
applied as each tile is written. Its results differ from the direct convolution's by
rounding only (about 1e-5 of the output scale in fp32).

The rewrite traces the model with torch.fx, folds each BatchNorm into the convolution before it
(eval mode), and replaces every eligible convolution (3x3, stride 1, padding 1, no dilation, one
group, channels multiples of 8), together with a ReLU that is its only user, or an addition that
is its only user followed by a ReLU that is the addition's only user (a residual block's end).

The operators live in libsluice_torch_ops.so, built beside the sluice binary (which carries the
same operators itself); SLUICE_TORCH_OPS names another path.
"""
import operator
import os

import torch
import torch.fx
import torch.nn as nn
import torch.nn.functional as F

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_loaded = None


def ops_library_path():
    return os.environ.get("SLUICE_TORCH_OPS",
                          os.path.join(_REPO, "build", "libsluice_torch_ops.so"))


def load_ops():
    """Loads Sluice's operators into this process once; returns whether they are available."""
    global _loaded
    if _loaded is None:
        path = ops_library_path()
        _loaded = os.path.isfile(path)
        if _loaded:
            torch.ops.load_library(path)
    return _loaded


def _eligible(conv):
    return (isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3) and conv.stride == (1, 1)
            and conv.padding == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros" and conv.in_channels % 8 == 0
            and conv.out_channels % 8 == 0 and conv.weight.dtype == torch.float32)


def _is_relu(node, modules):
    if node.op == "call_module":
        return isinstance(modules.get(node.target), nn.ReLU)
    return node.op == "call_function" and node.target in (torch.relu, F.relu)


def _is_add(node):
    return (node.op == "call_function" and node.target in (operator.add, torch.add)
            and len(node.args) == 2 and not node.kwargs)


def _only_user(node):
    return next(iter(node.users)) if len(node.users) == 1 else None


def rewrite(model):
    """Returns (module, count): `model` with its eligible convolutions replaced (a new
    torch.fx.GraphModule; `model` is not changed), and how many were. (model, 0) when the
    operators are not available or nothing is eligible."""
    if not load_ops() or not any(_eligible(m) for m in model.modules()):
        return model, 0
    from torch.fx.experimental.optimization import fuse
    try:
        gm = fuse(torch.fx.symbolic_trace(model.eval()))  # A copy with BatchNorms folded.
    except Exception as e:  # Not traceable by torch.fx (data-dependent control flow, ...).
        print(f"winograd: {type(model).__name__} left as it is: torch.fx cannot trace it ({e})",
              flush=True)
        return model, 0
    modules = dict(gm.named_modules())
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not _eligible(modules.get(node.target)):
            continue
        conv = modules[node.target]
        residual, relu, last = None, False, node
        user = _only_user(node)
        if user is not None and _is_relu(user, modules):
            relu, last = True, user
        elif user is not None and _is_add(user):
            after = _only_user(user)
            if after is not None and _is_relu(after, modules):
                residual = user.args[1] if user.args[0] is node else user.args[0]
                relu, last = True, after
        name = f"winograd_{count}"
        with torch.no_grad():
            gm.register_buffer(f"{name}_weight", conv.weight.detach().clone())
            bias = conv.bias if conv.bias is not None else torch.zeros(conv.out_channels)
            gm.register_buffer(f"{name}_bias", bias.detach().clone())
        with gm.graph.inserting_before(last):
            weight = gm.graph.get_attr(f"{name}_weight")
            bias_node = gm.graph.get_attr(f"{name}_bias")
            fused = gm.graph.call_function(torch.ops.sluice.conv3x3.default,
                                           (node.args[0], weight, bias_node, residual, relu))
        last.replace_all_uses_with(fused)
        count += 1
    gm.graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm, count
