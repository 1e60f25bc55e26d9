"""Top-k along the last dimension: the K largest entries of each row of a 2-D fp32 tensor, sorted
descending, and their column indices, like `torch.topk(x, K, dim=-1, largest=True, sorted=True)`.

Memory-bound and latency-bound: a kernel must read x once (4 bytes per element) and write K values
and K int64 indices per row (12 bytes per selected element); it does no floating-point arithmetic,
only comparisons, so the roofline counts zero flops and the floor is bandwidth. A selection pass
(radix select) followed by a sort of the K winners is the classic shape; torch's CUDA topk needs
many passes over each row and is far from that floor.

What "right" means (see `check`):
- The values are the reference's values exactly, position by position, compared by value: -0.0
  and +0.0 are equal, so a kernel may order them either way (torch's CUDA radix order puts -0.0
  below +0.0; a comparison sort keeps them equal). Infinities compare as themselves; inputs hold
  no NaN.
- Indices may order ties differently from torch: any index set is right when every index is in
  [0, S), no index repeats within a row, and x[row, index] is bitwise the value reported at that
  position (so the sign of a reported zero must be the element's own).
- The values are non-increasing along each row.

Cases:
- headline   64 x 4096, K=512: the KLineage paper's size. 1 MiB in, 384 KiB out: a single pass must
             finish in microseconds, so launches and on-chip passes, not DRAM, set the time.
- ragged     37 x 3001, K=100: a width no vector width or tile divides; rows are not 16-byte
             aligned.
- mid        200 x 1540, K=256: width divisible by 4 (vector loads apply) but not a power of two.
- k1         129 x 2053, K=1: the maximum; a sort of one element.
- k_eq_s     5 x 1000, K=1000: every element is selected; the output is the whole row sorted.
- wide_k     16 x 8192, K=2500: more winners than a 1024-thread block has threads.
- ties       96 x 2048, K=333: rows quantised to a few distinct values (and constant rows), so the
             K-th value is shared by many elements on both sides of the cut.
- infinities 50 x 1536, K=200: rows with +inf and -inf entries, some with more than K +inf entries,
             some needing -inf entries to fill K, some entirely -inf.
- narrow     257 x 30, K=20: rows shorter than a warp.
- large      4096 x 32768, K=64: 512 MiB in; torch.topk reads only ~327 GB/s here (vendor-baselines
             note), far below the 4.8 TB/s the H200 offers.
- small      9 x 100, K=10: the smallest (the sanitizer runs here); no infinities, so the
             reference outputs are finite.

Inputs mix row kinds (row by row, drawn from a CPU `torch.Generator`, so a seed gives the same
values on every device): scaled normals, uniform ranges, values quantised to a few levels (many
ties, -0.0 and +0.0 among them), rows sorted ascending and descending, constant rows, rows with
+inf and -inf entries, and rows spanning subnormals to 1e36 with signed zeros.
"""

from __future__ import annotations

import torch

OPERATOR = "topk"

CASES = {
    "headline": {"B": 64, "S": 4096, "K": 512, "mode": "mixed"},
    "ragged": {"B": 37, "S": 3001, "K": 100, "mode": "mixed"},
    "mid": {"B": 200, "S": 1540, "K": 256, "mode": "mixed"},
    "k1": {"B": 129, "S": 2053, "K": 1, "mode": "mixed"},
    "k_eq_s": {"B": 5, "S": 1000, "K": 1000, "mode": "mixed"},
    "wide_k": {"B": 16, "S": 8192, "K": 2500, "mode": "mixed"},
    "ties": {"B": 96, "S": 2048, "K": 333, "mode": "ties"},
    "infinities": {"B": 50, "S": 1536, "K": 200, "mode": "inf"},
    "narrow": {"B": 257, "S": 30, "K": 20, "mode": "mixed"},
    "large": {"B": 4096, "S": 32768, "K": 64, "mode": "mixed"},
    "small": {"B": 9, "S": 100, "K": 10, "mode": "finite"},
}
HEADLINE = "headline"
# reference() sees only x, so (B, S) must name one case and with it one K.
assert len({(c["B"], c["S"]) for c in CASES.values()}) == len(CASES), "two cases share (B, S): K is ambiguous"
assert all(1 <= c["K"] <= c["S"] for c in CASES.values())

OUTPUTS = {
    "values": {"shape": ["B", "K"], "dtype": "float32"},
    "indices": {"shape": ["B", "K"], "dtype": "int64"},
}

# Selection does no arithmetic: the values are copies of input elements, so they must be exact.
# (`check` judges the kernel; these apply to the vendor path compared with the reference.)
TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}

MATH = "fp32"

# Row kinds.
_NORMAL, _UNIFORM, _QUANTISED, _ASCENDING, _DESCENDING, _CONSTANT, _INFINITE, _EXTREME = range(8)
_KIND_NAMES = ("normal", "uniform", "quantised", "ascending", "descending", "constant", "infinite", "extreme")

# Per mode, the weight of each kind (in the order above).
_MODE_WEIGHTS = {
    "mixed": (0.30, 0.14, 0.14, 0.07, 0.07, 0.06, 0.11, 0.11),
    "finite": (0.30, 0.15, 0.15, 0.10, 0.10, 0.10, 0.00, 0.10),
    "ties": (0.00, 0.00, 0.85, 0.00, 0.00, 0.15, 0.00, 0.00),
    "inf": (0.00, 0.00, 0.20, 0.00, 0.00, 0.00, 0.80, 0.00),
}


def _rows(kinds: torch.Tensor, kind: int) -> torch.Tensor:
    return (kinds == kind).nonzero().squeeze(1)


def make_inputs(case: dict, seed: int, device) -> dict:
    """x of shape (B, S), fp32, deterministic per seed on every device; no NaN anywhere."""
    B, S, K = int(case["B"]), int(case["S"]), int(case["K"])
    mode = str(case.get("mode", "mixed"))
    weights = torch.tensor(_MODE_WEIGHTS[mode], dtype=torch.float64)
    gen = torch.Generator(device="cpu").manual_seed(0x70C40000 + int(seed))

    kinds = torch.multinomial(weights, B, replacement=True, generator=gen)
    present = weights.nonzero().squeeze(1)
    if B >= len(present):  # every kind of the mode appears at least once, in a seed-dependent row
        kinds[torch.randperm(B, generator=gen)[: len(present)]] = present

    # Base: scaled, shifted normals. Every kind below overwrites its own rows, drawing its random
    # numbers in a fixed order, so the whole tensor depends on the seed alone.
    scale = torch.empty(B, 1).uniform_(0.1, 10.0, generator=gen)
    shift = torch.empty(B, 1).uniform_(-5.0, 5.0, generator=gen)
    x = torch.randn(B, S, generator=gen).mul_(scale).add_(shift)

    rows = _rows(kinds, _UNIFORM)
    if len(rows):
        lo = torch.empty(len(rows), 1).uniform_(-100.0, 50.0, generator=gen)
        width = torch.empty(len(rows), 1).uniform_(0.5, 100.0, generator=gen)
        x[rows] = torch.rand(len(rows), S, generator=gen).mul_(width).add_(lo)

    rows = _rows(kinds, _QUANTISED)
    if len(rows):
        # round(normal * q) / q: from 3 to ~20 distinct values per row, so the K-th value is shared
        # by many elements; small negatives round to -0.0, so both zeros appear.
        q = torch.empty(len(rows), 1).uniform_(0.3, 3.0, generator=gen)
        x[rows] = torch.randn(len(rows), S, generator=gen).mul_(q).round_().div_(q)

    for kind, descending in ((_ASCENDING, False), (_DESCENDING, True)):
        rows = _rows(kinds, kind)
        if len(rows):
            x[rows] = x[rows].sort(dim=1, descending=descending).values

    rows = _rows(kinds, _CONSTANT)
    if len(rows):
        x[rows] = torch.empty(len(rows), 1).uniform_(-50.0, 50.0, generator=gen).expand(len(rows), S)

    rows = _rows(kinds, _INFINITE)
    if len(rows):
        # Per row, the share of +inf entries: none, under K, or over K (then every value is +inf);
        # and of -inf entries: none, some, most (K must then take -inf entries) or all.
        p_pos_choices = torch.tensor([0.0, 0.5 * K / S, min(1.0, 1.5 * K / S), 0.02])
        p_neg_choices = torch.tensor([0.0, 0.03, 0.5, 0.95, 1.0])
        p_pos = p_pos_choices[torch.randint(0, len(p_pos_choices), (len(rows), 1), generator=gen)]
        p_neg = p_neg_choices[torch.randint(0, len(p_neg_choices), (len(rows), 1), generator=gen)]
        u = torch.rand(len(rows), S, generator=gen)
        sub = x[rows]
        sub[u > 1.0 - p_neg] = float("-inf")
        sub[u < p_pos] = float("inf")
        x[rows] = sub

    rows = _rows(kinds, _EXTREME)
    if len(rows):
        # Magnitudes from 2^-140 (subnormal) to 2^120, either sign, and a few zeros of both signs:
        # an order on the bit patterns must get all of these right.
        exponent = torch.empty(len(rows), S).uniform_(-140.0, 120.0, generator=gen)
        sign = torch.randint(0, 2, (len(rows), S), generator=gen).float().mul_(2).sub_(1)
        sub = torch.exp2(exponent).mul_(sign)
        u = torch.rand(len(rows), S, generator=gen)
        sub[u < 0.05] = 0.0
        sub[(u >= 0.05) & (u < 0.10)] = -0.0
        x[rows] = sub

    return {"x": x.contiguous().to(device)}


def reference(inputs: dict) -> dict:
    # Selection is exact in fp32 (no arithmetic), so torch.topk on the input itself is the truth
    # for the values; its tie order is one of many right answers (see `check`).
    x = inputs["x"]
    k = _k_of(inputs)
    values, indices = torch.topk(x, k, dim=-1, largest=True, sorted=True)
    return {"values": values, "indices": indices}


def vendor(inputs: dict) -> dict:
    values, indices = torch.topk(inputs["x"], _k_of(inputs), dim=-1, largest=True, sorted=True)
    return {"values": values, "indices": indices}


def _k_of(inputs: dict) -> int:
    # The contract hands reference/vendor the inputs only, and K is no property of x: it is the
    # case's K, found by x's shape (unique per case: asserted below, where CASES are declared).
    rows, cols = inputs["x"].shape
    matches = {c["K"] for c in CASES.values() if c["B"] == rows and c["S"] == cols}
    if len(matches) != 1:
        raise ValueError(f"no unique case for x of shape {(rows, cols)}: K is ambiguous ({sorted(matches)})")
    return int(matches.pop())


def _first(mask: torch.Tensor) -> tuple[int, int] | None:
    """The first (row, position) where mask is True, in row-major order, or None."""
    if not bool(mask.any()):
        return None
    flat = int(mask.reshape(-1).nonzero()[0, 0])
    return divmod(flat, mask.shape[1])


def check(case: dict, inputs: dict, outputs: dict, expected: dict) -> str | None:
    """None when `outputs` is a right top-k of `inputs["x"]`, else what is wrong and where."""
    x = inputs["x"]
    values, indices = outputs["values"], outputs["indices"]
    ref_values = expected["values"]
    B, S, K = int(case["B"]), int(case["S"]), int(case["K"])
    if tuple(values.shape) != (B, K) or values.dtype != torch.float32:
        return f"values: expected float32 of shape {(B, K)}, got {values.dtype} {tuple(values.shape)}"
    if tuple(indices.shape) != (B, K) or indices.dtype != torch.int64:
        return f"indices: expected int64 of shape {(B, K)}, got {indices.dtype} {tuple(indices.shape)}"
    values = values.to(x.device)
    indices = indices.to(x.device)
    ref_values = ref_values.to(x.device)

    at = _first(values.isnan())
    if at is not None:
        return f"row {at[0]}, position {at[1]}: value is NaN (never written, or computed)"

    at = _first((indices < 0) | (indices >= S))
    if at is not None:
        return f"row {at[0]}, position {at[1]}: index {int(indices[at])} is outside [0, {S})"

    # Unique per row: after sorting a row's indices, equal neighbours are repeats.
    ordered = indices.sort(dim=1).values
    repeat = _first(ordered[:, 1:] == ordered[:, :-1]) if K > 1 else None
    if repeat is not None:
        row, _ = repeat
        dup = int(ordered[row, 1:][ordered[row, 1:] == ordered[row, :-1]][0])
        where = (indices[row] == dup).nonzero().squeeze(1).tolist()
        return f"row {row}: index {dup} appears more than once (positions {where[:4]})"

    # Each reported value is the element its index points at, bit for bit.
    gathered = torch.gather(x, 1, indices)
    at = _first(gathered.view(torch.int32) != values.view(torch.int32))
    if at is not None:
        r, p = at
        i = int(indices[r, p])
        return (f"row {r}, position {p}: value {float(values[r, p])!r} but x[{r}, {i}] is "
                f"{float(gathered[r, p])!r} (the index points at a different value)")

    if K > 1:
        at = _first(values[:, 1:] > values[:, :-1])
        if at is not None:
            r, p = at
            return (f"row {r}, positions {p} and {p + 1}: values not sorted descending "
                    f"({float(values[r, p])!r} then {float(values[r, p + 1])!r})")

    # Sorted, distinct elements of x: they are the top K exactly when their values are the
    # reference's values, position by position (by value: -0.0 == +0.0, inf == inf).
    at = _first(values != ref_values)
    if at is not None:
        r, p = at
        return (f"row {r}, position {p}: value {float(values[r, p])!r}, expected {float(ref_values[r, p])!r} "
                f"(the {p + 1}-th largest of the row)")
    return None


def roofline(case: dict) -> dict:
    # x read once (4 bytes per element); K values (4 bytes) and K int64 indices (8 bytes) written
    # per row. Selection compares, it computes nothing: zero flops.
    B, S, K = int(case["B"]), int(case["S"]), int(case["K"])
    return {"flops": 0.0, "bytes": 4.0 * B * S + 12.0 * B * K}
