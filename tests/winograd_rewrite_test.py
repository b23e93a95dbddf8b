#!/usr/bin/env python3
"""tools/winograd_rewrite.py with libsluice_torch_ops.so (argv[1]): which convolutions it gives to
sluice::conv3x3, what it fuses, that the rewritten model matches the original, that the operator
refuses bad arguments with a message, and that the test models' fp32 package (argv[2]) calls it."""
import os
import sys
import unittest
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
os.environ["SLUICE_TORCH_OPS"] = sys.argv[1]
TEST_MODELS = sys.argv[2]
del sys.argv[1:3]

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import winograd_rewrite  # noqa: E402


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(16, 16, 3, stride=2, padding=1)  # Stride 2: left alone.
        self.stem = nn.Conv2d(3, 16, 3, padding=1)  # 3 input channels: left alone.
        self.conv1, self.bn1 = nn.Conv2d(16, 24, 3, padding=1, bias=False), nn.BatchNorm2d(24)
        self.conv2, self.bn2 = nn.Conv2d(24, 16, 3, padding=1), nn.BatchNorm2d(16)
        self.conv3 = nn.Conv2d(16, 8, 3, padding=1)  # Followed by a sigmoid: no fusion.
        for bn in (self.bn1, self.bn2):
            nn.init.uniform_(bn.running_mean, -0.3, 0.3)
            nn.init.uniform_(bn.running_var, 0.5, 2.0)

    def forward(self, x):
        x = F.relu(self.stem(x))
        h = F.relu(self.bn1(self.conv1(x)))
        h = F.relu(self.bn2(self.conv2(h)) + x)
        return torch.sigmoid(self.conv3(self.down(h)))


def setUpModule():
    assert winograd_rewrite.load_ops(), winograd_rewrite.ops_library_path()


def calls(gm):
    return [n for n in gm.graph.nodes if n.target is torch.ops.sluice.conv3x3.default]


class RewriteTest(unittest.TestCase):
    def test_eligible_convolutions_are_replaced_and_fused(self):
        torch.manual_seed(0)
        model = Block().eval()
        gm, count = winograd_rewrite.rewrite(model)
        self.assertEqual(count, 3)
        relu_flags = [n.args[4] for n in calls(gm)]
        has_residual = [n.args[3] is not None for n in calls(gm)]
        self.assertEqual(relu_flags, [True, True, False])
        self.assertEqual(has_residual, [False, True, False])
        x = torch.randn(2, 3, 13, 11)  # Sides not multiples of 4: partial tiles.
        with torch.no_grad():
            want, got = model(x), gm(x)
        self.assertLess((want - got).abs().max().item(), 1e-5 * want.abs().max().item() + 1e-6)
        # The original model is not changed.
        self.assertIsInstance(model.conv1, nn.Conv2d)

    def test_models_without_eligible_convolutions_are_returned_as_they_are(self):
        model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 8, 1))
        self.assertIs(winograd_rewrite.rewrite(model)[0], model)

    def test_the_operator_refuses_bad_arguments_with_a_message(self):
        weight = torch.randn(16, 8, 3, 3)
        bias = torch.zeros(16)
        with self.assertRaisesRegex(RuntimeError, "input channels must be a positive multiple"):
            torch.ops.sluice.conv3x3(torch.randn(1, 12, 8, 8), torch.randn(16, 12, 3, 3), bias,
                                     None, False)
        with self.assertRaisesRegex(RuntimeError, "does not fit an input of 16 channels"):
            torch.ops.sluice.conv3x3(torch.randn(1, 16, 8, 8), weight, bias, None, False)
        with self.assertRaisesRegex(RuntimeError, "residual must be float32 shaped like"):
            torch.ops.sluice.conv3x3(torch.randn(1, 8, 8, 8), weight, bias,
                                     torch.randn(1, 8, 8, 8), False)
        with self.assertRaisesRegex(RuntimeError, "weight must be out x in x 3 x 3"):
            torch.ops.sluice.winograd_pack(torch.randn(16, 8, 5, 5))

    def test_a_weight_changed_in_place_is_packed_again(self):
        torch.manual_seed(1)
        x, weight, bias = torch.randn(1, 8, 6, 6), torch.randn(8, 8, 3, 3), torch.randn(8)
        def error():
            want = F.conv2d(x, weight, bias, padding=1)
            got = torch.ops.sluice.conv3x3(x, weight, bias, None, False)
            return (got - want).abs().max().item() / want.abs().max().item()

        self.assertLess(error(), 1e-5)
        weight.mul_(2)  # Same storage, a new version: a stale packed copy would be off by 50%.
        self.assertLess(error(), 1e-5)

    def test_the_test_models_fp32_package_calls_the_operator(self):
        path = os.path.join(TEST_MODELS, "tiny_residual_aot", "model.pt2")
        with zipfile.ZipFile(path) as z:
            text = b"".join(z.read(n) for n in z.namelist() if n.endswith(".json"))
        self.assertIn(b"sluice::conv3x3", text.replace(b"sluice.conv3x3", b"sluice::conv3x3"))


if __name__ == "__main__":
    unittest.main()
