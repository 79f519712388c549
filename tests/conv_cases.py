"""Convolution shapes and the float64 oracle shared by tests/test_conv.py and test_conv_gpu.py."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np

# NVFP4 operands are decoded in NumPy (matmul_cases.nvfp4_to_f64), not by the library under test.
_spec = importlib.util.spec_from_file_location("matmul_cases", Path(__file__).parent / "matmul_cases.py")
mc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mc)

# name: (N, H, W, C, K, R, S, strides, padding, dilation). C and K tails (not multiples of the
# 64-channel stage / the 64- or 128-channel tile), every filter size in {1, 3, 5, 7}, stride 1
# and 2, dilation, string and explicit padding, and small images whose rows meet inside one tile.
CASES = {
    "3x3_same": (2, 9, 9, 32, 24, 3, 3, (1, 1), "SAME", (1, 1)),
    "1x1_valid": (1, 8, 11, 16, 8, 1, 1, (1, 1), "VALID", (1, 1)),
    "5x5_c_k_tails": (3, 7, 7, 48, 70, 5, 5, (1, 1), "SAME", (1, 1)),
    "7x7_stride2": (2, 10, 13, 16, 40, 7, 7, (2, 2), "SAME", (1, 1)),
    "3x3_dilation2_explicit": (2, 12, 12, 32, 16, 3, 3, (1, 1), ((2, 0), (1, 3)), (2, 2)),
    "3x5_stride21_dil12": (1, 9, 15, 80, 136, 3, 5, (2, 1), "VALID", (1, 2)),
    "3x7_same_lower_stride12": (2, 6, 6, 16, 8, 3, 7, (1, 2), "SAME_LOWER", (1, 1)),
    "many_small_images": (9, 3, 4, 16, 130, 3, 3, (1, 1), "SAME", (1, 1)),
    "1x1_stride2_c144": (2, 7, 7, 144, 24, 1, 1, (2, 2), "VALID", (1, 1)),
}


def same_pads(size, taps, stride, dil, lower=False):
    """TensorFlow's SAME rule, written out independently of jax_nvfp4 and lax."""
    span = (taps - 1) * dil + 1
    out = -(-size // stride)
    total = max((out - 1) * stride + span - size, 0)
    small = total // 2
    return (total - small, small) if lower else (small, total - small)


def explicit_pads(x_shape, r, s, strides, padding, dilation):
    if padding == "VALID":
        return ((0, 0), (0, 0))
    if isinstance(padding, str):
        lower = padding == "SAME_LOWER"
        return (same_pads(x_shape[1], r, strides[0], dilation[0], lower),
                same_pads(x_shape[2], s, strides[1], dilation[1], lower))
    return padding


def direct_conv(x, w, strides, pads, dilation):
    """float64 direct convolution: x [N, H, W, C], w [R, S, K, C] -> [N, P, Q, K]."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    n, h, wd, _ = x.shape
    r, s, k, _ = w.shape
    (pt, pb), (pl, pr) = pads
    xp = np.zeros((n, h + pt + pb, wd + pl + pr, x.shape[3]))
    xp[:, pt:pt + h, pl:pl + wd] = x
    p = (h + pt + pb - (r - 1) * dilation[0] - 1) // strides[0] + 1
    q = (wd + pl + pr - (s - 1) * dilation[1] - 1) // strides[1] + 1
    out = np.zeros((n, p, q, k))
    for i in range(r):
        for j in range(s):
            h0, w0 = i * dilation[0], j * dilation[1]
            patch = xp[:, h0:h0 + (p - 1) * strides[0] + 1:strides[0],
                       w0:w0 + (q - 1) * strides[1] + 1:strides[1]]
            out += patch @ w[i, j].T
    return out


def oracle(x, w, case, bias=None):
    """float64 result of conv(x, w) for `case` on the dequantized operands."""
    _, _, _, _, _, r, s, strides, padding, dilation = case
    xv = mc.nvfp4_to_f64(x) if hasattr(x, "codes") else np.asarray(x, np.float64)
    pads = explicit_pads(xv.shape, r, s, strides, padding, dilation)
    out = direct_conv(xv, mc.nvfp4_to_f64(w), strides, pads, dilation)
    if bias is not None:
        out = out + np.asarray(bias, np.float64)
    return out


def rel_err(got, want):
    got = np.asarray(got, np.float64)
    assert not np.isnan(got).any(), "NaN in the result"
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), math.ulp(1.0)))
