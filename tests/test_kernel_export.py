"""Kernel folders out of stored states: `klineage kernel export` (a lineage state by fingerprint, or a
bundled kernel) and `klineage optimize --save`, each a folder `klineage gate` takes as it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from klineage.config import GateMode
from klineage.documents import read_document_text
from klineage.errors import KLineageError
from klineage.gate.pipeline import run_gate
from klineage.gate.verdict import Status
from klineage.kernel import load_kernel
from klineage.kernel_export import find_state, write_kernel_folder

ROOT = Path(__file__).resolve().parents[1]
SOFTMAX = ROOT / "corpus" / "problems" / "row_softmax.py"
LINEAGE = ROOT / "corpus" / "lineages" / "row_softmax_warp_vec4.gpu.json"


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "klineage", *args], capture_output=True, text=True, timeout=600,
                          cwd=ROOT, env={**os.environ, **(env or {})})


def test_a_lineage_state_exports_by_fingerprint_and_gates_from_its_folder(tmp_path, gate_cache):
    states = json.loads(read_document_text(LINEAGE))["states"]
    inner = states[len(states) // 2]  # a simplified state, not a bundled kernel
    done = cli("kernel", "export", inner["fingerprint"][:10], str(tmp_path / "k"))
    assert done.returncode == 0, done.stderr
    kernel = load_kernel(tmp_path / "k")
    assert kernel.fingerprint == inner["fingerprint"] and kernel.source == inner["source"]
    verdict = run_gate(SOFTMAX, kernel, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert verdict.status is Status.COMPILED, [f.message for f in verdict.findings]


def test_bundled_kernels_export_and_folders_are_never_overwritten(tmp_path):
    naive = find_state("row_softmax/naive")
    write_kernel_folder(naive, tmp_path)
    assert load_kernel(tmp_path).fingerprint == naive.fingerprint
    assert write_kernel_folder(naive, tmp_path) == tmp_path  # the same kernel again: nothing to do
    with pytest.raises(KLineageError, match="already holds kernel row_softmax_naive"):
        write_kernel_folder(find_state("row_softmax/warp_vec4"), tmp_path)
    with pytest.raises(KLineageError, match="give at least 8 hex digits"):
        find_state("abc")
    with pytest.raises(KLineageError, match="no lineage state 00000000"):
        find_state("00000000")


def test_optimize_save_writes_a_folder_the_gate_takes(tmp_path, gate_cache):
    out = tmp_path / "best"
    done = cli("optimize", "row_softmax", "--from", "row_softmax/naive", "--gate", "compile", "--budget", "1",
               "--out", str(tmp_path / "result.json"), "--save", str(out), "--json",
               env={"KLINEAGE_CACHE_DIR": os.environ["KLINEAGE_CACHE_DIR"]})
    assert done.returncode == 0, done.stderr
    best = json.loads(done.stdout)["best"]
    saved = load_kernel(out)
    assert saved.fingerprint == best["fingerprint"]
    verdict = run_gate(SOFTMAX, saved, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
    assert verdict.status is Status.COMPILED, [f.message for f in verdict.findings]
