"""Timing every case: problems' SWEEP tables, the policy option, the gate's key and plans for sweep cases."""

from pathlib import Path

import pytest

from klineage import devices
from klineage.config import GateMode
from klineage.errors import DocumentError
from klineage.gate.execute import problem_fingerprint
from klineage.gate.pipeline import run_gate
from klineage.gate.policy import GatePolicy, Placement, TimingScope
from klineage.gate.verdict import Status
from klineage.kernel import load_kernel
from klineage.problem import ProblemInfo, contract_source, load_problem
from sampled import sampled

FIXTURE = (Path(__file__).parent / "fixtures" / "documents" / "modern_problem.py").read_text(encoding="utf-8")
CORPUS = Path(__file__).resolve().parents[1] / "corpus"
SWEPT = ("gemm", "row_softmax", "fmha", "gdn")  # conv2d and topk find a case from its shapes in CASES


def with_sweep(table: str) -> str:
    marker = "\nOUTPUTS"
    assert marker in FIXTURE, "the fixture no longer declares OUTPUTS at the start of a line"
    return FIXTURE.replace(marker, f"\n{table}\n\nOUTPUTS", 1)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "problem.py"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_literal_sweep_is_left_out_of_the_fingerprint(tmp_path):
    plain = problem_fingerprint(write(tmp_path, FIXTURE))
    swept = write(tmp_path, with_sweep('SWEEP = {  # comments inside the braces go too\n'
                                       '    "tall": {"rows": 4096, "cols": 8, "dtype": "float32"},\n}'))
    assert problem_fingerprint(swept) == plain
    info = load_problem(swept).info
    assert info.fingerprint == plain
    assert [c.name for c in info.sweep] == ["tall"] and "tall" not in [c.name for c in info.cases]
    assert info.case("tall").params["rows"] == 4096 and "tall" in info.roofline
    assert ProblemInfo.from_dict(info.to_dict()) == info
    assert "sweep" not in load_problem(write(tmp_path, FIXTURE)).info.to_dict()  # probes of old files keep their bytes


def test_a_sweep_that_runs_code_stays_in_the_fingerprint(tmp_path):
    """The attack: a SWEEP statement that changes CASES would change what the problem judges while its
    fingerprint (and so every recorded verdict's key) stayed: only a literal table is left out."""
    plain = problem_fingerprint(write(tmp_path, FIXTURE))
    sneaky = with_sweep('SWEEP = CASES.update({"tall": {"rows": 4096, "cols": 8, "dtype": "float32"}}) or {}')
    assert problem_fingerprint(write(tmp_path, sneaky)) != plain
    assert contract_source(sneaky) == sneaky


@pytest.mark.parametrize("table, fragment", [
    ('SWEEP = {"small": {"rows": 8, "cols": 8, "dtype": "float32"}}', "also CASES"),
    ('SWEEP = [1, 2]', "SWEEP must be a dict"),
    ('SWEEP = {"bad name": {"rows": 8}}', "must be an identifier"),
    ('SWEEP = {"tall": {"rows": 8, "cols": 8, "dtype": "float99"}}', "dtype 'float99'"),
])
def test_bad_sweeps_are_refused(tmp_path, table, fragment):
    with pytest.raises(DocumentError, match=fragment):
        load_problem(write(tmp_path, with_sweep(table)))


def test_the_option_is_left_out_of_the_policy_at_its_default():
    """Recorded verdicts are keyed by the policy's fingerprint: a policy that times the headline reads
    exactly as it did before the option existed."""
    assert "timing_scope" not in GatePolicy().to_dict()
    every = GatePolicy(timing_scope=TimingScope.EVERY_CASE)
    assert every.to_dict()["timing_scope"] == "every_case" and every.fingerprint != GatePolicy().fingerprint
    assert GatePolicy.from_dict(every.to_dict()) == every
    assert every.correctness_twin() == GatePolicy().correctness_twin()
    with pytest.raises(DocumentError, match="timing_scope must be one of headline, every_case"):
        GatePolicy.from_dict({"timing_scope": "some"})


@pytest.mark.parametrize("operator", SWEPT)
def test_corpus_sweeps_span_where_mechanisms_flip(operator):
    """At least six sweep cases, and the fingerprint every recorded verdict of the problem is keyed by
    is that of the file without them."""
    path = CORPUS / "problems" / f"{operator}.py"
    text = path.read_text(encoding="utf-8")
    info = load_problem(path).info
    assert len(info.sweep) >= 6
    assert "SWEEP" not in contract_source(text) and "SWEEP" in text
    names = {c.name for c in info.cases} | {c.name for c in info.sweep}
    assert len(names) == len(info.cases) + len(info.sweep)


# Each operator's kernels gated on every sweep case cost seconds of nvcc: the default run keeps a reduction and a
# tensor-core GEMM; attention and the gated delta net resolve under -m slow.
@pytest.mark.parametrize("operator", sampled(SWEPT, keep=("row_softmax", "gemm")))
def test_sweep_cases_resolve_for_the_expert_and_naive_plans(operator, gate_cache):
    """The compile-only gate of each corpus kernel of the operator under a policy that times every case:
    it compiles, and its launch plan resolves for every sweep case it supports (a case a plan cannot
    resolve, or one over the shared-memory limit, would be a plan_error / resource_limit rejection);
    the key names each sweep case with a digest of its parameters."""
    policy = GatePolicy(timing_scope=TimingScope.EVERY_CASE, placement=Placement.AS_LOADED)
    problem = CORPUS / "problems" / f"{operator}.py"
    info = load_problem(problem).info
    kernels = sorted(p.parent for p in (CORPUS / "kernels" / operator).glob("*/launch.toml"))
    assert kernels
    for folder in kernels:
        state = load_kernel(folder)
        verdict = run_gate(problem, state, policy=policy, mode=GateMode.COMPILE_ONLY, cache=gate_cache)
        assert verdict.status is Status.COMPILED, (folder.name, verdict.findings)
        swept = [c for c in verdict.provenance["key_parts"]["cases"] if c.startswith("sweep:")]
        facts = {**state.constants, **devices.DEFAULT.facts()}
        supported = [c.name for c in info.sweep if state.plan.supports_case(c.params, facts)]
        assert {c.split(":")[1] for c in swept} == set(supported), folder.name
        assert len(supported) >= 6, f"{folder.name} supports only {supported} of the sweep"
