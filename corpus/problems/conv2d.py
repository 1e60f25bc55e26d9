"""2-D convolution, fp16, channels last: y[n, p, q, f] = sum_{r, s, c} x[n, p*stride - pad + r, q*stride - pad + s, c] * w[f, r, s, c].

x is NHWC [N, H, W, C], w is KRSC [F, R, S, C] ("channels last" filters), y is NHWC [N, P, Q, F] with
P = (H + 2*pad - R) // stride + 1 and Q = (W + 2*pad - S) // stride + 1; taps outside the image read
zero (zero padding); no bias. All three tensors are plain contiguous tensors of those shapes, so a
pixel's channels are contiguous in memory: the layout tensor-core implicit GEMM wants (GEMM M = N*P*Q
output pixels, N = F filters, K = R*S*C taps, every K-slice of 8 channels one 16-byte load).

The headline is a ResNet-stage 3x3 convolution: 25088 x 128 x 576 as a GEMM, 3.7 GFLOP, so small
that a kernel must fill every SM in a single launch to approach the tensor-core roofline.

Cases:
- headline   N=8, 56x56, C=64 -> F=128, 3x3, stride 1, pad 1 (ResNet-50 conv2_x shape, doubled F).
- odd_hw     31x31 (odd, prime): N*P*Q = 1922 is divisible by no M tile, and F=96 by no 128 N tile.
- odd_c      C=40 (divisible by 8 but not by 16 or 32): K-slices of 32 or 64 channels straddle
             filter taps, so the (r, s, c) decomposition of K must be exact; F=72.
- strided    stride 2 on an odd 57x57 image: P = Q = 29, the border taps differ per side.
- stem       the first layer of an image network: C=3 (RGB), 7x7 filters, stride 2, pad 3. C is
             not a multiple of 8, so pixel rows are not 16-byte aligned: kernels that copy 8
             channels at a time declare they do not support it, and a general kernel must not.
- pointwise  a 1x1 convolution (R=S=1, pad 0): implicit GEMM degenerates to a plain GEMM.
- small      N=1, 9x9, C=8 -> F=16: the smallest; the sanitizer runs here.

Inputs (drawn from a CPU `torch.Generator`, the same values on every device): every (image, channel)
plane picks a kind, ReLU-like (half zeros), zero-mean normal, uniform, offset (a large common value,
so outputs rely on cancellation across taps), or sparse; every channel then gets its own scale, as
activations of real networks do. Filters are Kaiming-scaled (std 1/sqrt(R*S*C)) with per-filter
scales and kinds: normal, uniform, non-negative (a blur), sparse. Outputs have a standard deviation
of a few units and reach a few tens: far from fp16 overflow, with fp16 rounding steps up to 1/32.
"""

from __future__ import annotations

import torch

OPERATOR = "conv2d"

CASES = {
    "headline": {"N": 8, "H": 56, "W": 56, "C": 64, "F": 128, "R": 3, "S": 3, "stride": 1, "pad": 1},
    "odd_hw": {"N": 2, "H": 31, "W": 31, "C": 64, "F": 96, "R": 3, "S": 3, "stride": 1, "pad": 1},
    "odd_c": {"N": 3, "H": 28, "W": 28, "C": 40, "F": 72, "R": 3, "S": 3, "stride": 1, "pad": 1},
    "strided": {"N": 2, "H": 57, "W": 57, "C": 32, "F": 64, "R": 3, "S": 3, "stride": 2, "pad": 1},
    "stem": {"N": 2, "H": 64, "W": 64, "C": 3, "F": 64, "R": 7, "S": 7, "stride": 2, "pad": 3},
    "pointwise": {"N": 4, "H": 28, "W": 28, "C": 128, "F": 96, "R": 1, "S": 1, "stride": 1, "pad": 0},
    "small": {"N": 1, "H": 9, "W": 9, "C": 8, "F": 16, "R": 3, "S": 3, "stride": 1, "pad": 1},
}
HEADLINE = "headline"

OUTPUTS = {"y": {"shape": ["N", "(H + 2*pad - R) // stride + 1", "(W + 2*pad - S) // stride + 1", "F"],
                 "dtype": "float16"}}

# fp16 defaults, written out with the reasoning. The reference is the float64 result rounded once to
# fp16, so a kernel that accumulates in fp32 differs from it by at most about one fp16 rounding:
# relative 2^-11 ~ 4.9e-4 per element (rel_l2 ~ 3e-4), plus fp32 summation error over K = R*S*C <=
# 576 terms, ~1e-5 absolute at these magnitudes (output std a few units, the largest a few tens). atol 1e-2
# covers outputs near zero, where cancellation makes a relative bound meaningless; rtol 1e-2 is
# twenty fp16 roundings. A kernel that accumulates in fp16 adds one rounding of the running sum per
# tap, K of them, ~sqrt(K) * 2^-11 * |partial sum| ~ 1e-2 and more on the large outputs: it fails,
# as it should (fp16 accumulation is a different, less accurate operator).
TOLERANCES = {"float16": {"rtol": 1e-2, "atol": 1e-2, "rel_l2": 5e-3}}

MATH = "fp16"

# Activation plane kinds and filter kinds, drawn with these weights.
_RELU, _NORMAL, _UNIFORM, _OFFSET, _SPARSE = range(5)
_PLANE_WEIGHTS = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.1], dtype=torch.float64)
_F_NORMAL, _F_UNIFORM, _F_POSITIVE, _F_SPARSE = range(4)
_FILTER_WEIGHTS = torch.tensor([0.5, 0.25, 0.15, 0.1], dtype=torch.float64)


def output_size(size: int, kernel: int, stride: int, pad: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _kinds(weights: torch.Tensor, count: int, gen: torch.Generator) -> torch.Tensor:
    kinds = torch.multinomial(weights, count, replacement=True, generator=gen)
    if count >= len(weights):  # every kind appears at least once, at a seed-dependent place
        where = torch.randperm(count, generator=gen)[: len(weights)]
        kinds[where] = torch.arange(len(weights))
    return kinds


def make_inputs(case: dict, seed: int, device) -> dict:
    """x [N, H, W, C] and w [F, R, S, C], fp16, contiguous; deterministic per seed on every device."""
    n, h, w_, c = (int(case[k]) for k in ("N", "H", "W", "C"))
    f, r, s = (int(case[k]) for k in ("F", "R", "S"))
    gen = torch.Generator(device="cpu").manual_seed(0xC0DE0000 + int(seed))

    # Activations: one kind per (image, channel) plane, mixed in one pass as a*normal + b*uniform + d,
    # then ReLU where the kind says so and a sparsity mask where it says so.
    kinds = _kinds(_PLANE_WEIGHTS, n * c, gen).view(n, 1, 1, c)
    is_kind = [(kinds == k).float() for k in range(len(_PLANE_WEIGHTS))]
    scale = torch.empty(n, 1, 1, c).uniform_(0.25, 3.0, generator=gen)  # per-channel scale
    a = (is_kind[_RELU] + is_kind[_NORMAL] + is_kind[_SPARSE]) * scale + is_kind[_OFFSET] * 0.25
    b = is_kind[_UNIFORM] * scale
    d = is_kind[_OFFSET] * torch.empty(n, 1, 1, c).uniform_(2.0, 6.0, generator=gen)
    x = torch.randn(n, h, w_, c, generator=gen).mul_(a)
    x.addcmul_(torch.rand(n, h, w_, c, generator=gen).mul_(2).sub_(1), b).add_(d)
    x = torch.where(is_kind[_RELU].bool(), x.clamp_min(0.0), x)
    keep = torch.rand(n, h, w_, c, generator=gen) < 0.15
    x = torch.where(is_kind[_SPARSE].bool() & ~keep, torch.zeros(()), x)

    # Filters: Kaiming std 1/sqrt(fan_in), one kind and one extra scale per filter.
    fan_in = r * s * c
    fkinds = _kinds(_FILTER_WEIGHTS, f, gen).view(f, 1, 1, 1)
    fscale = torch.empty(f, 1, 1, 1).uniform_(0.5, 2.0, generator=gen) / fan_in ** 0.5
    normal = torch.randn(f, r, s, c, generator=gen)
    uniform = torch.rand(f, r, s, c, generator=gen).mul_(2).sub_(1).mul_(3 ** 0.5)  # unit variance
    weights = torch.where(fkinds == _F_UNIFORM, uniform, normal)
    weights = torch.where(fkinds == _F_POSITIVE, weights.abs(), weights)
    sparse_keep = torch.rand(f, r, s, c, generator=gen) < 0.2
    weights = torch.where((fkinds == _F_SPARSE) & ~sparse_keep, torch.zeros(()), weights).mul_(fscale)

    return {"x": x.to(torch.float16).contiguous().to(device),
            "w": weights.to(torch.float16).contiguous().to(device)}


# reference and vendor see only the tensors; the stride and padding of a case are found from its
# shapes (no two cases share N, H, W, C, F, R, S), so that neither needs a device-to-host copy.
def _geometry(x: torch.Tensor, w: torch.Tensor) -> tuple[int, int]:
    key = (*x.shape, *w.shape[:3])  # N, H, W, C, F, R, S
    for params in CASES.values():
        if key == tuple(params[k] for k in ("N", "H", "W", "C", "F", "R", "S")):
            return int(params["stride"]), int(params["pad"])
    raise ValueError(f"conv2d: no case has x {tuple(x.shape)} and w {tuple(w.shape)}")


_SIGNATURES = [tuple(p[k] for k in ("N", "H", "W", "C", "F", "R", "S")) for p in CASES.values()]
assert len(set(_SIGNATURES)) == len(_SIGNATURES), "two cases share shapes: _geometry could not tell them apart"


def reference(inputs: dict) -> dict:
    # float64, rounded once to fp16: the reference carries no error of its own beyond that rounding.
    # (float32 would do numerically, but on CUDA PyTorch runs float32 convolutions in TF32 by default,
    # cudnn.allow_tf32 = True, which would put ~1e-3 relative error into the reference itself.)
    x, w = inputs["x"], inputs["w"]
    stride, pad = _geometry(x, w)
    xd = x.to(torch.float64).permute(0, 3, 1, 2).contiguous()  # NCHW
    wd = w.to(torch.float64).permute(0, 3, 1, 2).contiguous()  # FCRS
    y = torch.nn.functional.conv2d(xd, wd, stride=stride, padding=pad)
    return {"y": y.permute(0, 2, 3, 1).to(torch.float16).contiguous()}


def vendor(inputs: dict) -> dict:
    # cuDNN on the tensors as they lie: permuting NHWC to NCHW gives a channels_last-strided view,
    # so cuDNN runs its NHWC kernels with no layout transform, and its output (channels_last) permuted
    # back is already a contiguous NHWC tensor. benchmark=True lets cuDNN pick its fastest algorithm.
    torch.backends.cudnn.benchmark = True
    x, w = inputs["x"], inputs["w"]
    stride, pad = _geometry(x, w)
    y = torch.nn.functional.conv2d(x.permute(0, 3, 1, 2), w.permute(0, 3, 1, 2), stride=stride, padding=pad)
    return {"y": y.permute(0, 2, 3, 1).contiguous()}


def roofline(case: dict) -> dict:
    n, h, w_, c, f, r, s = (int(case[k]) for k in ("N", "H", "W", "C", "F", "R", "S"))
    p = output_size(h, r, int(case["stride"]), int(case["pad"]))
    q = output_size(w_, s, int(case["stride"]), int(case["pad"]))
    # One multiply-add per (output element, tap, channel); bytes: x and w read once, y written once.
    return {"flops": 2.0 * n * p * q * f * r * s * c,
            "bytes": 2.0 * (n * h * w_ * c + f * r * s * c + n * p * q * f)}
