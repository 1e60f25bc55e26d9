"""Numeric domain errors in plan expressions are the plan's error, named, never a raw TypeError."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from klineage import expr
from klineage.errors import ExpressionError
from shared_cache import share

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("text, words", [
    ("(-8)**0.5", "not a real number"),
    ("((-8)**0.5) * 0 + 4", "not a real number"),  # the complex part is caught where it arises
    ("N / 0", "division by zero"),
    ("N % 0", "division by zero"),
    ("1e300 ** 2", "too large for a number"),
    ("1e308 * 10", "not a finite number"),
    ("2 ** 65", "exponent too large"),
    ("(2 ** 60) ** 64", "more than 256 bits"),
    ("log2(0)", "math domain error"),
    ("1.5 << 2", "cannot be evaluated"),
])
def test_domain_errors_name_the_expression(text, words):
    with pytest.raises(ExpressionError) as caught:
        expr.evaluate_int(text, {"N": 8})
    assert words in str(caught.value)
    assert text in str(caught.value)


def test_real_results_still_pass():
    assert expr.evaluate("N ** 0.5", {"N": 16}) == 4.0
    assert expr.evaluate_int("cdiv(N, 3)", {"N": 8}) == 3


def test_cli_gate_exits_2_with_a_message_on_a_plan_that_cannot_be_evaluated(tmp_path, shared_cache):
    kernel = tmp_path / "kernel"
    kernel.mkdir()
    plan = (REPO / "corpus/kernels/row_softmax/naive/launch.toml").read_text()
    assert 'grid = ["rows"]' in plan
    (kernel / "launch.toml").write_text(plan.replace('grid = ["rows"]', 'grid = ["(-8)**0.5"]'))
    (kernel / "kernel.cu").write_text((REPO / "corpus/kernels/row_softmax/naive/kernel.cu").read_text())
    # no verdict of its own; the problem's probe and the compile are the run's (tests/shared_cache.py)
    env = {**os.environ, "KLINEAGE_CACHE_DIR": str(share(tmp_path / "cache", shared_cache))}
    done = subprocess.run([sys.executable, "-m", "klineage", "gate", "row_softmax", str(kernel), "--compile-only"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "error: the launch plan is wrong" in done.stderr
    assert "(-8)**0.5" in done.stderr and "not a real number" in done.stderr
