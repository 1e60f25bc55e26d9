"""Gated delta net (GDN): the gated delta rule, forward, as FLA's `chunk_gated_delta_rule` computes it.

Per batch b and value head h (value head h reads query/key head h // (HV // H): grouped value
attention, GVA), a state S of shape [DK, DV] starts at zero and, for t = 0 .. T-1:

    S   <- exp(g_t) * S                         (log-space gate: g_t < 0, a decay in (0, 1))
    u_t  = beta_t * (v_t - S^T k_t)             (the delta rule's correction, with the decayed S)
    S   <- S + k_t u_t^T
    o_t  = scale * S^T q_t                      (scale = DK ** -0.5, FLA's default)

equivalently S_t = exp(g_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T. This is FLA's
`naive_recurrent_gated_delta_rule` (fla/ops/gated_delta_rule/naive.py) term for term. FLA's chunked
kernels compute the same map in chunks of 64 tokens (a WY/UT representation of the product of the
chunk's (I - beta k k^T) factors, a 64 x 64 lower-triangular solve, then one state update per chunk);
a kernel may use either form.

Layout, FLA's ("[B, T, H, D]", heads inside tokens, `head_first` removed from FLA):
- q, k  [B, T, H, DK]  bfloat16, each head vector L2-normalised (FLA's `use_qk_l2norm_in_kernel`
        is left off: the normalisation is part of the inputs, so a kernel does not redo it)
- v     [B, T, HV, DV] bfloat16
- g     [B, T, HV]     float32, log-space decay (Qwen3-Next computes it in fp32: -exp(A_log) *
        softplus(a + dt_bias)); here g = logsigmoid(x), so exp(g) lies in (0, 1)
- beta  [B, T, HV]     bfloat16, in (0, 1) (a sigmoid), as FLA expects it post-sigmoid
- o     [B, T, HV, DV] bfloat16 (FLA returns o in q's dtype)

Cases:
- headline     B1 T4096, 16 q/k heads, 48 value heads (each q/k head serves 3), DK = DV = 128:
               a Qwen3-Next-like linear-attention layer over a 4K prefill.
- ragged_t     T = 1000: not a multiple of the chunk (1000 = 15 * 64 + 40), so the last chunk is partial.
- equal_heads  H = HV = 16 (no GVA), B2 T2048: every value head has its own q/k head, and a batch.
- small        B1 T100 H2 HV2, DK = DV = 64: the smallest; the sanitizer runs here.

Inputs (CPU `torch.Generator`, the same on every device): q and k normal with a per-head offset
direction, then L2-normalised; v normal with a per-head scale; the gate's pre-activation mixes
slow heads (decay 0.95-0.999 per token, long memory: errors and state accumulate over hundreds of
tokens) and fast heads (decay 0.3-0.9); beta is a sigmoid with a per-head bias, so some heads write
almost fully (beta near 1) and some barely.
"""

from __future__ import annotations

import math

import torch

OPERATOR = "gdn"

CHUNK = 64  # FLA's chunk size for the vendor path (the KLineage paper's size)
# FLA's forward is ~10 Triton launches from Python: timed eagerly, part of its time is the host's
# launch path (and how busy the host is); replayed from a CUDA graph, none of it. Both are timed.
VENDOR_TIMING = ("eager", "graph")

CASES = {
    "headline": {"B": 1, "T": 4096, "H": 16, "HV": 48, "DK": 128, "DV": 128},
    "ragged_t": {"B": 1, "T": 1000, "H": 16, "HV": 48, "DK": 128, "DV": 128},
    "equal_heads": {"B": 2, "T": 2048, "H": 16, "HV": 16, "DK": 128, "DV": 128},
    "small": {"B": 1, "T": 100, "H": 2, "HV": 2, "DK": 64, "DV": 64},
}
HEADLINE = "headline"

SWEEP = {  # timed only (klineage.problem): sequence length against the chunk, heads against 132 SMs
    "t_short": {"B": 1, "T": 256, "H": 16, "HV": 48, "DK": 128, "DV": 128},  # four chunks
    "t_long": {"B": 1, "T": 8192, "H": 4, "HV": 12, "DK": 128, "DV": 128},  # a long recurrence, few heads
    "heads_few": {"B": 1, "T": 2048, "H": 2, "HV": 2, "DK": 128, "DV": 128},  # far fewer heads than SMs
    "batch_large": {"B": 8, "T": 1024, "H": 16, "HV": 16, "DK": 128, "DV": 128},  # 128 heads in all
    "t_unaligned": {"B": 1, "T": 1500, "H": 16, "HV": 48, "DK": 128, "DV": 128},  # a partial last chunk
    "dk64": {"B": 2, "T": 2048, "H": 8, "HV": 8, "DK": 64, "DV": 64},  # half-size heads (zero-padded tiles)
    "one_chunk": {"B": 4, "T": 64, "H": 16, "HV": 48, "DK": 128, "DV": 128},
}

OUTPUTS = {"o": {"shape": ["B", "T", "HV", "DV"], "dtype": "bfloat16"}}

# Why these bounds. A kernel that keeps S in fp32 and rounds o to bf16 once differs from the fp64
# reference by half a bf16 step (2^-9 relative) plus fp32 drift (~1e-6): rel_l2 ~1.1e-3. The chunked
# form reorders the arithmetic and, as FLA does it, rounds its intermediates to bf16 too: the solved
# (I + A)^-1, w = A (beta exp(g) k), u = A (beta v), the per-chunk state h fed to the output matmul,
# and v_new = u - w h; each is one more bf16 rounding (2^-9 relative) of an O(1) operand of an
# O(DK)-long fp32 dot product. A CPU emulation of exactly those roundings (`chunked` in
# tests/test_corpus_gdn.py) lands at rel_l2 3.6e-3 (small) and 4.5e-3 (ragged_t, all 48 heads), with a
# worst element error of 3.9e-3 on ragged_t, on slow heads where S sums hundreds of tokens. The delta
# rule is a contraction (the eigenvalues of I - beta k k^T are 1 - beta and 1), so these errors do not
# grow along T.
# - rel_l2 1.5e-2: three times that emulation, so the vendor passes with margin; a kernel that drops
#   the gate or beta, maps value heads to the wrong q/k head, or shifts o by a token fails by far.
# - atol 6e-3: outputs are small (rms ~0.02-0.03, max ~0.5: q and k are unit vectors, scale = DK^-0.5),
#   so near-zero elements are judged against the output's scale, not their own. The emulated vendor
#   reaches 0.55 of the elementwise bound at atol 5e-3 and 1.19 at 2e-3 on ragged_t, so 6e-3 (~0.47,
#   about 2x margin) is as tight as the vendor allows; it is ~20% of the rms, so the elementwise test
#   catches gross local errors and rel_l2 catches systematic ones.
# - rtol 3e-2: four bf16 steps (2^-7 = 0.78% each) on the large elements.
TOLERANCES = {"bfloat16": {"rtol": 3e-2, "atol": 6e-3, "rel_l2": 1.5e-2}}

MATH = "bf16"


def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-6)


def make_inputs(case: dict, seed: int, device) -> dict:
    """q, k [B,T,H,DK], v [B,T,HV,DV] bf16; g [B,T,HV] fp32; beta [B,T,HV] bf16 (FLA's layout)."""
    b, t, h, hv = (int(case[n]) for n in ("B", "T", "H", "HV"))
    dk, dv = int(case["DK"]), int(case["DV"])
    gen = torch.Generator(device="cpu").manual_seed(0x6D400000 + int(seed))

    # q and k: a per-head mean direction (queries and keys of one head are correlated, so S^T q does
    # not average out) plus isotropic noise, then unit length per head vector.
    q_mean = _unit_rows(torch.randn(1, 1, h, dk, generator=gen)) * torch.empty(1, 1, h, 1).uniform_(0.0, 1.5, generator=gen)
    k_mean = _unit_rows(torch.randn(1, 1, h, dk, generator=gen)) * torch.empty(1, 1, h, 1).uniform_(0.0, 1.5, generator=gen)
    q = _unit_rows(torch.randn(b, t, h, dk, generator=gen) / math.sqrt(dk) + q_mean)
    k = _unit_rows(torch.randn(b, t, h, dk, generator=gen) / math.sqrt(dk) + k_mean)

    v_scale = torch.empty(1, 1, hv, 1).uniform_(0.5, 2.0, generator=gen)
    v = torch.randn(b, t, hv, dv, generator=gen) * v_scale

    # The gate: half the heads slow (logit 3..7: exp(g) = sigmoid(x) in ~0.95..0.999), half fast
    # (logit -1..2: decay ~0.27..0.88), in a seed-dependent order; per-token noise on top.
    slow = torch.randperm(hv, generator=gen) < (hv + 1) // 2
    centre = torch.where(slow, torch.empty(hv).uniform_(3.0, 7.0, generator=gen),
                         torch.empty(hv).uniform_(-1.0, 2.0, generator=gen))
    g = torch.nn.functional.logsigmoid(centre + 0.5 * torch.randn(b, t, hv, generator=gen))

    beta_bias = torch.empty(hv).uniform_(-2.0, 3.0, generator=gen)
    beta = torch.sigmoid(beta_bias + torch.randn(b, t, hv, generator=gen))

    bf16 = torch.bfloat16
    return {
        "q": q.to(bf16).contiguous().to(device),
        "k": k.to(bf16).contiguous().to(device),
        "v": v.to(bf16).contiguous().to(device),
        "g": g.to(torch.float32).contiguous().to(device),
        "beta": beta.to(bf16).contiguous().to(device),
    }


def recurrence(q, k, v, g, beta, scale: float, dtype=torch.float64) -> torch.Tensor:
    """The token-by-token recurrence, batched over (batch, value head); o as [B, T, HV, DV] in `dtype`."""
    b, t, h, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group = hv // h
    # value head j reads q/k head j // group (FLA: i_h // (HV // H)), i.e. each head repeated `group` times
    qf = q.to(dtype).repeat_interleave(group, dim=2) * scale
    kf = k.to(dtype).repeat_interleave(group, dim=2)
    vf, bf = v.to(dtype), beta.to(dtype)
    decay = g.to(dtype).exp()
    s = torch.zeros(b * hv, dk, dv, dtype=dtype, device=q.device)
    o = torch.empty(b, t, hv, dv, dtype=dtype, device=q.device)
    for i in range(t):
        k_row = kf[:, i].reshape(b * hv, 1, dk)
        s.mul_(decay[:, i].reshape(b * hv, 1, 1))
        kv = torch.bmm(k_row, s).reshape(b, hv, dv)  # S^T k, as the row vector k^T S
        u = bf[:, i, :, None] * (vf[:, i] - kv)  # beta (v - S^T k)
        s.addcmul_(k_row.transpose(1, 2), u.reshape(b * hv, 1, dv))  # S + k u^T
        o[:, i] = torch.bmm(qf[:, i].reshape(b * hv, 1, dk), s).reshape(b, hv, dv)  # S^T q
    return o


def reference(inputs: dict, case: dict) -> dict:
    # fp64 on every device: the reference is the truth to ~1e-12, so the whole tolerance is the
    # kernel's (and the vendor's). fp64 matmuls have no TF32 or reduced-precision path (those apply
    # to fp32 and half types only), so the batched matrix-vector products are exact-ish everywhere.
    q, k, v, g, beta = (inputs[n] for n in ("q", "k", "v", "g", "beta"))
    scale = int(case["DK"]) ** -0.5
    return {"o": recurrence(q, k, v, g, beta, scale).to(torch.bfloat16)}


def vendor(inputs: dict, case: dict) -> dict:
    # FLA's chunked Triton kernels (only on the GPU host): same layout, post-sigmoid beta, log-space
    # g, inputs already normalised, default scale DK ** -0.5, chunk 64, zero initial state. (FLA 0.6
    # dispatches to FlashQLA's TileLang kernels instead where the `flash_qla` package is installed, on
    # SM90 with DK = DV = 128, and those ignore chunk_size; the GPU host's wheels do not include it.)
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, _ = chunk_gated_delta_rule(
        inputs["q"], inputs["k"], inputs["v"], inputs["g"], inputs["beta"],
        scale=int(case["DK"]) ** -0.5, initial_state=None, output_final_state=False,
        use_qk_l2norm_in_kernel=False, chunk_size=CHUNK,
    )
    return {"o": o.to(torch.bfloat16)}


def chunk_flops(case: dict, chunk: int = CHUNK) -> float:
    """Flops of the chunked algorithm over all (padded) chunks, per value head: see `roofline`."""
    c, dk, dv = chunk, int(case["DK"]), int(case["DV"])
    intra = 2.0 * c * c * dk * 3 + 2.0 * c * c * dv * 2  # A = beta K K^T, w = A Kg, Q K^T; u = A V, P v_new
    solve = c ** 3 / 3.0  # (I + A)^-1 for a unit lower-triangular 64 x 64 A
    state = 2.0 * c * dk * dv * 3  # w S (v_new), Q S (inter-chunk output), K^T v_new (state update)
    chunks = -(-int(case["T"]) // c)
    return float(int(case["B"]) * int(case["HV"]) * chunks * (intra + solve + state))


def roofline(case: dict) -> dict:
    # Flops: the chunked algorithm's (the token-by-token recurrence does 6 DK DV per token, which is
    # similar at DK = DV = 128 but runs on CUDA cores; the chunked form puts it on tensor cores).
    # Bytes: q, k (bf16, per q/k head), v and o (bf16, per value head), g (fp32) and beta (bf16) once.
    b, t, h, hv = (int(case[n]) for n in ("B", "T", "H", "HV"))
    dk, dv = int(case["DK"]), int(case["DV"])
    bytes_ = 2.0 * b * t * h * dk * 2 + 2.0 * b * t * hv * dv * 2 + 4.0 * b * t * hv + 2.0 * b * t * hv
    return {"flops": chunk_flops(case), "bytes": bytes_}
