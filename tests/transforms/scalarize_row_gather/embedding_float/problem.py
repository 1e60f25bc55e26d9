"""Embedding lookup: out[t, :] = weight[tokens[t], :], for scalarize_row_gather's GPU test (its own operator, not
a corpus or transfer one). The odd case's row length (769) does not divide by four: the forwarded kernel's scalar
path must give the same bits there."""

from __future__ import annotations

import torch

OPERATOR = "embedding_rows"

CASES = {
    "headline": {"n_tokens": 32768, "dim": 1024, "vocab": 50000},
    "odd": {"n_tokens": 1001, "dim": 769, "vocab": 3001},
    "small": {"n_tokens": 7, "dim": 8, "vocab": 5},
}
HEADLINE = "headline"

OUTPUTS = {"out": {"shape": ["n_tokens", "dim"], "dtype": "float32"}}

TOLERANCES = {"float32": {"rtol": 0.0, "atol": 0.0, "rel_l2": 0.0}}


def make_inputs(case: dict, seed: int, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(0xE4B + int(seed))
    n_tokens, dim, vocab = int(case["n_tokens"]), int(case["dim"]), int(case["vocab"])
    weight = torch.randn(vocab, dim, generator=gen)
    tokens = torch.randint(0, vocab, (n_tokens,), generator=gen, dtype=torch.int64)
    return {"weight": weight.to(device), "tokens": tokens.to(device)}


def reference(inputs: dict) -> dict:
    return {"out": torch.nn.functional.embedding(inputs["tokens"], inputs["weight"])}


def vendor(inputs: dict) -> dict:
    return {"out": torch.nn.functional.embedding(inputs["tokens"], inputs["weight"])}


def roofline(case: dict) -> dict:
    n = int(case["n_tokens"]) * int(case["dim"])
    return {"flops": 0.0, "bytes": 8.0 * n + 8.0 * int(case["n_tokens"])}
