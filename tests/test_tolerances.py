"""TOLERANCES: dtype and per-output entries, partial entries filled from their own dtype, unknown keys refused."""

from pathlib import Path

import pytest

from klineage.errors import DocumentError
from klineage.problem import DEFAULT_TOLERANCES, Tolerance, load_problem, tolerance_for

MODERN = (Path(__file__).parent / "fixtures" / "documents" / "modern_problem.py").read_text(encoding="utf-8")
DECLARED = 'TOLERANCES = {"float16": {"rtol": 1e-3, "atol": 2e-3, "rel_l2": 5e-4}}'


def load_with(tmp_path: Path, tolerances: str):
    assert DECLARED in MODERN, "the fixture no longer declares its tolerances this way"
    path = tmp_path / "problem.py"
    path.write_text(MODERN.replace(DECLARED, f"TOLERANCES = {tolerances}"), encoding="utf-8")
    return load_problem(path).info


def refused(tmp_path: Path, tolerances: str) -> str:
    with pytest.raises(DocumentError) as info:
        load_with(tmp_path, tolerances)
    return str(info.value)


def test_partial_dtype_entry_fills_from_its_own_dtype(tmp_path):
    info = load_with(tmp_path, '{"bfloat16": {"rtol": 0.05}}')
    assert info.tolerances["bfloat16"] == Tolerance(rtol=0.05, atol=DEFAULT_TOLERANCES["bfloat16"].atol,
                                                    rel_l2=DEFAULT_TOLERANCES["bfloat16"].rel_l2)
    assert info.tolerances["bfloat16"].atol == 2e-2  # not float32's 1e-5


def test_per_output_entry_overrides_its_dtype(tmp_path):
    # 'sums' is float32 in the fixture; 'y' takes its dtype from the case ('dtype' parameter).
    info = load_with(tmp_path, '{"float32": {"atol": 1e-4}, "sums": {"atol": 0.5}}')
    sums = tolerance_for("float32", info.tolerances, "sums")
    assert sums == Tolerance(rtol=1e-4, atol=0.5, rel_l2=1e-5)  # the rest from float32's (overridden) entry
    assert tolerance_for("float32", info.tolerances, "y") == Tolerance(rtol=1e-4, atol=1e-4, rel_l2=1e-5)
    assert tolerance_for("float16", info.tolerances, "y") == DEFAULT_TOLERANCES["float16"]


def test_output_with_case_dtype_needs_a_full_entry(tmp_path):
    message = refused(tmp_path, '{"y": {"atol": 0.5}}')
    assert "TOLERANCES['y']" in message and "case parameter 'dtype'" in message and "missing rtol, rel_l2" in message
    info = load_with(tmp_path, '{"y": {"rtol": 0.1, "atol": 0.5, "rel_l2": 0.01}}')
    assert tolerance_for("float16", info.tolerances, "y") == Tolerance(rtol=0.1, atol=0.5, rel_l2=0.01)


@pytest.mark.parametrize("tolerances, fragment", [
    ('{"fp16": {"rtol": 1e-2}}', "TOLERANCES key 'fp16' is neither a float dtype"),
    ('{"float16": {"rtol": 1e-2, "abs": 1e-3}}', "TOLERANCES['float16']: unknown tolerance field(s) abs"),
    ('{"sums": {"atol": 0.1, "tol": 1}}', "TOLERANCES['sums']: unknown tolerance field(s) tol"),
    ('{"int32": {"rtol": 1e-2}}', "int32 outputs are compared exactly"),
    ('{"float16": {"rtol": True}}', "rtol must be a number in [0, 1)"),
    ('[("float16", 1e-2)]', "TOLERANCES must be a dict"),
])
def test_bad_tolerances_are_refused_naming_the_key(tmp_path, tolerances, fragment):
    assert fragment in refused(tmp_path, tolerances)
