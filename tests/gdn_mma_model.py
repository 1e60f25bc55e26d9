"""A numpy model of gdn/chunked_mma: the two launches' algorithm step by step, vectorised over (batch,
value head), with the kernel's chunking, zero padding, in-chunk gate sum, blocked triangular solve, operand
forms (Xb = X diag(beta), R = v - e^G K S, Vn = Xb R, e^(G_last - G) Vn) and bf16 roundings. Matmuls of
bf16 operands are exact products summed in float64 and rounded to float32 (the tensor cores' fp32
accumulation, to within reassociation)."""

from __future__ import annotations

import numpy as np

F32 = np.float32


def bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32: __float2bfloat16_rn."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return bits.view(np.float32)


def mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(F32)


def fma(a, b, c):
    """fmaf: one rounding of a b + c (float64 holds the fp32 product exactly)."""
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def prep(k: np.ndarray, q: np.ndarray, graw: np.ndarray, beta: np.ndarray, sub: int = 16):
    """Launch 1 for a batch of chunks: k, q [N, C, DKM] (bf16 values), graw, beta [N, C] fp32.
    Returns Xb, P (bf16 values, [N, C, C]) and G ([N, C], fp32)."""
    n, c, _ = k.shape
    G = np.zeros_like(graw)
    acc = np.zeros(n, F32)
    for i in range(c):  # the sequential in-chunk sum
        acc = (acc + graw[:, i]).astype(F32)
        G[:, i] = acc
    i_idx, j_idx = np.arange(c)[:, None], np.arange(c)[None, :]
    kk = mm(k, k.transpose(0, 2, 1))
    qk = mm(q, k.transpose(0, 2, 1))
    with np.errstate(over="ignore", invalid="ignore"):
        decay = np.where(i_idx >= j_idx, np.exp(G[:, :, None] - G[:, None, :]), F32(0)).astype(F32)
    L = np.where(i_idx > j_idx, (beta[:, :, None] * kk).astype(F32) * decay, F32(0)).astype(F32)
    P = bf16(np.where(i_idx >= j_idx, qk * decay, F32(0)).astype(F32))
    X = np.zeros((n, c, c), F32)
    nsub = c // sub
    for blk in range(nsub):  # diagonal blocks: column j by forward substitution
        base = blk * sub
        D = np.zeros((n, sub, sub), F32)
        for i in range(sub):
            s = np.broadcast_to((np.arange(sub) == i).astype(F32), (n, sub)).copy()
            for m in range(i):
                s = fma(-L[:, base + i, base + m][:, None], D[:, m, :], s)
            D[:, i, :] = s
        X[:, base:base + sub, base:base + sub] = D
    for bi in range(1, nsub):  # block rows: T_j = sum_m L_{bi,m} X_{m,j}; X_{bi,j} = -X_{bi,bi} T_j
        rb = bi * sub
        for j in range(bi):
            Tj = np.zeros((n, sub, sub), F32)
            for m in range(j * sub, rb):
                Tj = fma(L[:, rb:rb + sub, m][:, :, None], X[:, m, j * sub:(j + 1) * sub][:, None, :], Tj)
            s = np.zeros((n, sub, sub), F32)
            for p in range(sub):  # X_{bi,bi} is lower triangular: terms p > r are zero
                s = fma(X[:, rb:rb + sub, rb + p][:, :, None], Tj[:, p, :][:, None, :], s)
            X[:, rb:rb + sub, j * sub:(j + 1) * sub] = -s
    Xb = bf16(np.where(i_idx >= j_idx, X * beta[:, None, :], F32(0)).astype(F32))
    return Xb, P, G, X


def chunked_mma(q, k, v, g, beta, chunk: int = 64, max_dk: int = 128):
    """The whole kernel on torch CPU inputs ([B,T,H,DK] etc.); returns o [B, T, HV, DV] as float32 holding
    bf16 values."""
    q, k, v = (x.float().numpy() for x in (q, k, v))
    g = g.float().numpy().astype(F32)
    beta = beta.float().numpy()
    B, T, H, DK = q.shape
    HV, DV = v.shape[2], v.shape[3]
    grp = HV // H
    nt = -(-T // chunk)
    pad = nt * chunk - T
    n = B * HV

    def blocks(x, width):  # [B, T, heads, D] -> [B * HV, nt, chunk, width] zero-padded in T and D
        if x.shape[2] != HV:
            x = np.repeat(x, grp, axis=2)  # value head hv reads q/k head hv // grp
        x = np.concatenate([x, np.zeros((B, pad) + x.shape[2:], F32)], 1)
        if x.ndim == 4:
            x = np.concatenate([x, np.zeros(x.shape[:3] + (width - x.shape[3],), F32)], 3)
            return x.transpose(0, 2, 1, 3).reshape(n, nt, chunk, width)
        return x.transpose(0, 2, 1).reshape(n, nt, chunk)

    qb, kb = blocks(q, max_dk), blocks(k, max_dk)
    vb = blocks(v, DV)
    gb, bb = blocks(g, 0), blocks(beta, 0)
    Xb, P, G, _ = prep(kb.reshape(n * nt, chunk, max_dk), qb.reshape(n * nt, chunk, max_dk),
                       gb.reshape(n * nt, chunk), bb.reshape(n * nt, chunk))
    Xb, P, G = Xb.reshape(n, nt, chunk, chunk), P.reshape(n, nt, chunk, chunk), G.reshape(n, nt, chunk)

    scale = F32(1.0) / np.sqrt(F32(DK))
    S = np.zeros((n, max_dk, DV), F32)
    o = np.zeros((n, nt, chunk, DV), F32)
    for c in range(nt):
        Kc, Qc, Vc, Gc = kb[:, c], qb[:, c], vb[:, c], G[:, c]
        Sb = bf16(S)
        eg = np.exp(Gc)[:, :, None]
        R = bf16(fma(-eg, mm(Kc, Sb), Vc))
        oacc = (eg * mm(Qc, Sb)).astype(F32)
        Vn = mm(Xb[:, c], R)
        g_last = Gc[:, -1]
        Vnb = bf16(Vn)
        Vd = bf16((Vn * np.exp(g_last[:, None] - Gc)[:, :, None]).astype(F32))
        o[:, c] = bf16((scale * (oacc + mm(P[:, c], Vnb))).astype(F32))
        S = ((np.exp(g_last)[:, None, None] * S).astype(F32) + mm(Kc.transpose(0, 2, 1), Vd)).astype(F32)
    o = o.reshape(B, HV, nt * chunk, DV)[:, :, :T].transpose(0, 2, 1, 3)
    return np.ascontiguousarray(o)


def prep_scratch(q, k, g, beta, chunk: int = 64, max_dk: int = 128):
    """The model's launch 1 in the kernel's scratch layout: Xb, P as [B * HV * chunks, chunk, chunk] and G
    as [B * HV * chunks, chunk] (chunk index fastest, then value head, then batch)."""
    B, T, H, DK = q.shape
    HV = g.shape[2]
    nt = -(-T // chunk)
    pad = nt * chunk - T

    def blocks(t, repeat=1):
        a = t.float().numpy().astype(F32)
        if repeat > 1:
            a = np.repeat(a, repeat, axis=2)  # value head hv reads q/k head hv // repeat
        a = np.concatenate([a, np.zeros((B, pad) + a.shape[2:], F32)], 1)
        if a.ndim == 4:
            a = np.concatenate([a, np.zeros(a.shape[:3] + (max_dk - DK,), F32)], 3)
            return a.transpose(0, 2, 1, 3).reshape(B * HV * nt, chunk, max_dk)
        return a.transpose(0, 2, 1).reshape(B * HV * nt, chunk)

    Xb, P, G, _ = prep(blocks(k, HV // H), blocks(q, HV // H), blocks(g), blocks(beta))
    return Xb, P, G


def scratch_mismatch(got: np.ndarray, want: np.ndarray) -> str:
    """'' when a kernel's bf16 operand `got` is the model's `want` up to reassociated fp32 sums (a bf16
    step here and there, nothing unwritten); else what is wrong."""
    if not np.isfinite(got).all():
        return f"{int((~np.isfinite(got)).sum())} elements unwritten (NaN) or not finite"
    diff = np.abs(got.astype(np.float64) - want)
    scale = float(np.abs(want).max())
    if diff.max() > 2.0 ** -7 * scale:
        return f"max difference {diff.max():.3g} against a scale of {scale:.3g}"
    rel = float(np.linalg.norm(diff) / max(np.linalg.norm(want), 1e-30))
    if rel > 1e-3:
        return f"relative L2 difference {rel:.3g}"
    return ""
