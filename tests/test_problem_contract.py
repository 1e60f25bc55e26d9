"""The problem contract: what a problem file must declare, and the numerics a gate can trust."""

import json
from pathlib import Path

import pytest
import torch

from klineage.errors import DocumentError
from klineage.problem import (
    DEFAULT_TOLERANCES,
    EXACT,
    LEGACY_CASE,
    OutputSpec,
    ProblemInfo,
    RunToRun,
    Tolerance,
    VendorTiming,
    load_problem,
    tolerance_for,
    validate_numerics,
)

FIXTURES = Path(__file__).parent / "fixtures" / "documents"
MODERN = (FIXTURES / "modern_problem.py").read_text(encoding="utf-8")
LEGACY = (FIXTURES / "legacy_problem.py").read_text(encoding="utf-8")


def write(tmp_path: Path, text: str, name: str = "problem.py") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def variant(old: str, new: str, base: str = MODERN) -> str:
    assert old in base, f"fixture no longer contains {old!r}"
    return base.replace(old, new)


def refused(tmp_path: Path, text: str, *fragments: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(DocumentError) as info:
        load_problem(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, message
    return message


# A valid problem


def test_valid_problem_loads(tmp_path):
    path = write(tmp_path, MODERN)
    problem = load_problem(path)
    info = problem.info
    assert info.operator == "scaled_add"
    assert info.path == str(path)
    assert len(info.fingerprint) == 64
    assert [c.name for c in info.cases] == ["small", "wide"]
    assert info.case("wide").params == {"rows": 3, "cols": 64, "dtype": "float16", "fast": True, "scale": 0.5}
    assert info.headline == "wide"
    assert [o.name for o in info.outputs] == ["y", "sums"]
    assert info.outputs[0].resolve(info.case("small").params) == ((4, 8), "float32")
    assert info.outputs[0].resolve(info.case("wide").params) == ((3, 64), "float16")
    assert info.outputs[1].resolve(info.case("wide").params) == ((3,), "float32")
    assert info.tolerances == {"float16": Tolerance(rtol=1e-3, atol=2e-3, rel_l2=5e-4)}
    assert info.roofline == {"small": {"flops": 64.0, "bytes": 384.0}, "wide": {"flops": 384.0, "bytes": 1152.0}}
    assert (info.has_vendor, info.has_check, info.legacy, info.math) == (True, True, False, "fp16")
    assert info.description.startswith("Scaled add: y = 2 * a + b")


def test_valid_problem_functions_work(tmp_path):
    problem = load_problem(write(tmp_path, MODERN))
    params = problem.info.case("small").params
    inputs = problem.make_inputs(params, 3, "cpu")
    assert set(inputs) == {"a", "b"} and inputs["a"].shape == (4, 8)
    expected = problem.reference(inputs)
    assert list(expected) == ["y", "sums"]
    torch.testing.assert_close(expected["y"], 2 * inputs["a"] + inputs["b"])
    vendor = problem.vendor(inputs)  # returns a tuple: named by OUTPUTS
    assert list(vendor) == ["y", "sums"]
    torch.testing.assert_close(vendor["sums"], expected["sums"])
    assert problem.check(params, inputs, expected, expected) is None
    assert validate_numerics(problem) == []


def test_problem_info_round_trips_through_json(tmp_path):
    info = load_problem(write(tmp_path, MODERN)).info
    again = ProblemInfo.from_dict(json.loads(json.dumps(info.to_dict())))
    assert again == info


def test_fingerprint_follows_content_not_formatting(tmp_path):
    a = load_problem(write(tmp_path, MODERN, "a.py")).info.fingerprint
    b = load_problem(write(tmp_path, MODERN.replace("\n", "  \r\n"), "b.py")).info.fingerprint
    c = load_problem(write(tmp_path, MODERN.replace("1234", "1235"), "c.py")).info.fingerprint
    assert a == b != c


def test_headline_defaults_to_the_first_case(tmp_path):
    problem = load_problem(write(tmp_path, variant('HEADLINE = "wide"\n', "")))
    assert problem.info.headline == "small"


def test_optional_declarations_may_be_absent(tmp_path):
    text = MODERN
    for old in ('TOLERANCES = {"float16": {"rtol": 1e-3, "atol": 2e-3, "rel_l2": 5e-4}}\n', 'MATH = "fp16"\n'):
        text = variant(old, "", text)
    text = variant("def vendor(", "def _vendor(", text)
    text = variant("def check(", "def _check(", text)
    info = load_problem(write(tmp_path, text)).info
    assert (info.tolerances, info.math, info.has_vendor, info.has_check) == ({}, "fp32", False, False)


def test_a_problem_may_define_dataclasses(tmp_path):
    # With postponed annotations, @dataclass looks the class's module up in sys.modules.
    text = ("from __future__ import annotations\nfrom dataclasses import dataclass\n\n"
            "@dataclass\nclass Shape:\n    rows: int\n\n" + MODERN)
    assert load_problem(write(tmp_path, text)).info.operator == "scaled_add"


def test_unknown_case_names_the_cases(tmp_path):
    info = load_problem(write(tmp_path, MODERN)).info
    with pytest.raises(DocumentError, match=r"^scaled_add: no case 'huge' \(cases: small, wide\)$"):
        info.case("huge")


def test_tolerances():
    assert tolerance_for("float16", {}) == DEFAULT_TOLERANCES["float16"]
    assert tolerance_for("int32", {}) == EXACT
    custom = Tolerance(0.1, 0.1, 0.1)
    assert tolerance_for("float16", {"float16": custom}) is custom
    base = DEFAULT_TOLERANCES["bfloat16"]
    assert Tolerance.from_dict({"rtol": 0.01}, "t", base) == Tolerance(0.01, base.atol, base.rel_l2)  # rest from base
    with pytest.raises(DocumentError, match="^t: missing atol, rel_l2$"):
        Tolerance.from_dict({"rtol": 0.01}, "t")
    with pytest.raises(DocumentError, match=r"^t: rtol must be a number in \[0, 1\), got 1\.5$"):
        Tolerance.from_dict({"rtol": 1.5}, "t", base)
    with pytest.raises(DocumentError, match=r"unknown tolerance field\(s\) ulp"):
        Tolerance.from_dict({"rtol": 0.1, "ulp": 2}, "t")


# Contract violations


def test_missing_file(tmp_path):
    with pytest.raises(DocumentError, match="problem file not found"):
        load_problem(tmp_path / "none.py")


def test_non_utf8_file(tmp_path):
    path = tmp_path / "problem.py"
    path.write_bytes(b"# caf\xe9\n" + MODERN.encode())
    with pytest.raises(DocumentError, match="problem file is not UTF-8"):
        load_problem(path)


def test_no_operator(tmp_path):
    refused(tmp_path, variant('OPERATOR = "scaled_add"\n', ""), "OPERATOR must be an identifier string")


def test_operator_not_an_identifier(tmp_path):
    refused(tmp_path, variant('OPERATOR = "scaled_add"', 'OPERATOR = "scaled add"'), "OPERATOR must be an identifier")


@pytest.mark.parametrize("cases", ["{}", "[]", "None", '[("small", {"rows": 1})]'])
def test_cases_empty_or_not_a_dict(tmp_path, cases):
    text = variant("CASES = {", f"CASES = {cases}\n_UNUSED = {{")
    refused(tmp_path, text, "CASES must be a non-empty dict of case name -> parameters")


@pytest.mark.parametrize("name", ["big case", "1st", "", "a-b"])
def test_bad_case_name(tmp_path, name):
    refused(tmp_path, variant('"small": {', f'{name!r}: {{'), f"case name {name!r} must be an identifier")


def test_case_that_is_not_a_dict(tmp_path):
    refused(tmp_path, variant('"small": {"rows": 4, "cols": 8, "dtype": "float32"}', '"small": [4, 8]'),
            "case 'small' must be a dict of parameters")


@pytest.mark.parametrize("value", ["None", "[4]", "(4, 8)", "{'a': 1}", "torch.float32", "1j"])
def test_parameter_not_number_or_string(tmp_path, value):
    refused(tmp_path, variant('"rows": 4,', f'"rows": {value},'),
            "case 'small': parameter 'rows' must be a number, bool or string")


def test_parameter_not_finite(tmp_path):
    refused(tmp_path, variant('"rows": 4,', '"rows": float("nan"),'), "case 'small': parameter 'rows' is not finite")


def test_parameter_name_not_an_identifier(tmp_path):
    refused(tmp_path, variant('"rows": 4,', '"rows": 4, "num rows": 4,'),
            "case 'small': parameter name 'num rows' must be an identifier")


@pytest.mark.parametrize("dtype", ["fp32", "torch.float32", "float", "half"])
def test_bad_dtype_string(tmp_path, dtype):
    refused(tmp_path, variant('"dtype": "float32"}', f'"dtype": "{dtype}"}}'),
            f"case 'small': dtype '{dtype}' is not one of float64, float32")


def test_bad_output_dtype(tmp_path):
    refused(tmp_path, variant('"dtype": "float32"},\n}', '"dtype": "f32"},\n}'),
            "case 'small', output 'sums'", "dtype 'f32' is not one of")


def test_headline_not_in_cases(tmp_path):
    refused(tmp_path, variant('HEADLINE = "wide"', 'HEADLINE = "large"'), "HEADLINE 'large' is not one of the CASES")


@pytest.mark.parametrize("outputs", ["", "OUTPUTS = {}\n", "OUTPUTS = ['y']\n"])
def test_outputs_missing(tmp_path, outputs):
    start = MODERN.index("OUTPUTS = {")
    end = MODERN.index("}\n\nTOLERANCES") + 2
    text = MODERN[:start] + outputs + MODERN[end:]
    refused(tmp_path, text, "OUTPUTS must be a dict of output name -> {shape, dtype}")


@pytest.mark.parametrize(
    "shape, fragments",
    [
        ('["rows +"]', ("output 'sums'", "syntax error")),
        ('["rows.size"]', ("output 'sums'", "'Attribute' is not allowed")),
        ('["len(rows)"]', ("output 'sums'", "unknown function")),
        ('["ROWS"]', ("case 'small', output 'sums'", "unknown name 'ROWS' (known: cols, rows)")),
        ('["rows / 3"]', ("case 'small', output 'sums'", "must be a whole number")),
        ('["rows - 4"]', ("case 'small': output 'sums' has an empty shape (0,)",)),
        ("[]", ("output 'sums': shape must be a non-empty list",)),
        ('"rows"', ("output 'sums': shape must be a non-empty list",)),
        ("[1.5]", ("output 'sums': dimension 1.5 is not a number or expression",)),
    ],
)
def test_output_shape_with_bad_expression(tmp_path, shape, fragments):
    refused(tmp_path, variant('"sums": {"shape": ["rows"]', f'"sums": {{"shape": {shape}'), *fragments)


def test_output_without_dtype(tmp_path):
    refused(tmp_path, variant('"sums": {"shape": ["rows"], "dtype": "float32"}', '"sums": {"shape": ["rows"]}'),
            "output 'sums' needs 'shape' (a list) and 'dtype'")


@pytest.mark.parametrize(
    "signature, takes",
    [("make_inputs(case, seed)", 2), ("make_inputs(case, seed, device, extra)", 4), ("make_inputs()", 0)],
)
def test_make_inputs_with_wrong_arity(tmp_path, signature, takes):
    refused(tmp_path, variant("make_inputs(case, seed, device)", signature),
            f"'make_inputs' must take 3 positional parameters, takes {takes}")


def test_make_inputs_missing(tmp_path):
    refused(tmp_path, variant("def make_inputs(", "def _make_inputs("), "must define a function 'make_inputs'")


def test_reference_missing_or_wrong_arity(tmp_path):
    refused(tmp_path, variant("def reference(inputs)", "def _reference(inputs)"), "must define a function 'reference'")
    refused(tmp_path, variant("def reference(inputs)", "def reference(inputs, case, extra)"),
            "'reference' must take 1 or 2 positional parameters, takes 3")


def test_vendor_and_check_arity(tmp_path):
    refused(tmp_path, variant("def vendor(inputs)", "def vendor()"), "'vendor' must take 1 or 2 positional parameters")
    refused(tmp_path, variant("def check(case, inputs, outputs, expected)", "def check(outputs, expected)"),
            "'check' must take 4 positional parameters, takes 2")


def test_vendor_timing_defaults_to_eager_and_may_add_a_graph_replay(tmp_path):
    assert load_problem(write(tmp_path, MODERN)).info.vendor_timing == (VendorTiming.EAGER,)
    both = variant('MATH = "fp16"\n', 'MATH = "fp16"\nVENDOR_TIMING = ("eager", "graph")\n')
    info = load_problem(write(tmp_path, both)).info
    assert info.vendor_timing == (VendorTiming.EAGER, VendorTiming.GRAPH)
    assert ProblemInfo.from_dict(json.loads(json.dumps(info.to_dict()))) == info


@pytest.mark.parametrize("value, fragment", [
    ('"graph"', "must be a non-empty tuple"),
    ("()", "must be a non-empty tuple"),
    ('("eager", "replay")', "names a mode other than 'eager', 'graph'"),
    ('("graph", "graph")', "names a mode twice"),
])
def test_malformed_vendor_timing_is_refused(tmp_path, value, fragment):
    refused(tmp_path, variant('MATH = "fp16"\n', f'MATH = "fp16"\nVENDOR_TIMING = {value}\n'), "VENDOR_TIMING",
            fragment)


def test_run_to_run_defaults_to_bitwise_and_may_allow_differences_within_tolerance(tmp_path):
    info = load_problem(write(tmp_path, MODERN)).info
    assert info.run_to_run is RunToRun.BITWISE and "run_to_run" not in info.to_dict()  # old descriptions keep bytes
    loose = load_problem(write(tmp_path, MODERN + 'RUN_TO_RUN = "within_tolerance"\n', "loose.py")).info
    assert loose.run_to_run is RunToRun.WITHIN_TOLERANCE and loose.fingerprint != info.fingerprint
    assert ProblemInfo.from_dict(json.loads(json.dumps(loose.to_dict()))) == loose


@pytest.mark.parametrize("value", ['"loose"', '"Bitwise"', "True", '["bitwise"]'])
def test_an_unknown_run_to_run_is_refused(tmp_path, value):
    refused(tmp_path, MODERN + f"RUN_TO_RUN = {value}\n", "RUN_TO_RUN must be one of 'bitwise', 'within_tolerance'")


def test_vendor_timing_needs_a_vendor(tmp_path):
    text = variant("def vendor(", "def _vendor(",
                   variant('MATH = "fp16"\n', 'MATH = "fp16"\nVENDOR_TIMING = ("graph",)\n'))
    refused(tmp_path, text, "VENDOR_TIMING is set but the problem has no vendor function")


def test_roofline_missing(tmp_path):
    refused(tmp_path, variant("def roofline(case)", "def _roofline(case)"), "must define a function 'roofline'")


def test_roofline_returning_negative_bytes(tmp_path):
    refused(tmp_path, variant('"bytes": 3 * n * size', '"bytes": -3 * n * size'),
            "roofline(small) must give positive bytes and non-negative flops")


def test_roofline_returning_zero_bytes_or_negative_flops(tmp_path):
    refused(tmp_path, variant('"bytes": 3 * n * size', '"bytes": 0'), "roofline(small) must give positive bytes")
    refused(tmp_path, variant('"flops": 2 * n', '"flops": -1'),
            "roofline(small) must give positive bytes and non-negative flops")


def test_roofline_returning_the_wrong_shape(tmp_path):
    refused(tmp_path, variant('return {"flops": 2 * n, "bytes": 3 * n * size}', "return 3 * n"),
            "roofline(small) must return {'flops': ..., 'bytes': ...}")
    refused(tmp_path, variant('"flops": 2 * n, ', ""), "roofline(small) must return {'flops': ..., 'bytes': ...}")


def test_roofline_that_raises(tmp_path):
    refused(tmp_path,
            variant("    n = case", "    if case['dtype'] == 'float16':\n        raise KeyError('k')\n    n = case"),
            "roofline(wide) raised KeyError: 'k'")


def test_bad_math_unit(tmp_path):
    refused(tmp_path, variant('MATH = "fp16"', 'MATH = "fp8"'), "MATH must be fp32, tf32, fp16 or bf16, not 'fp8'")


def test_bad_tolerance(tmp_path):
    refused(tmp_path, variant('"rtol": 1e-3', '"rtol": 2'), "TOLERANCES['float16']",
            "rtol must be a number in [0, 1), got 2")


def test_file_that_raises_at_import(tmp_path):
    message = refused(tmp_path, variant("import torch\n", "import torch\nraise RuntimeError('no GPU here: 42')\n"))
    assert message.endswith("raised RuntimeError while loading: no GPU here: 42")


def test_file_with_an_import_error(tmp_path):
    refused(tmp_path, "import klineage_no_such_module\n" + MODERN,
            "raised ModuleNotFoundError while loading: No module named 'klineage_no_such_module'")


def test_file_that_exits_at_import(tmp_path):
    refused(tmp_path, "import sys\nsys.exit(3)\n" + MODERN, "raised SystemExit while loading: 3")


def test_file_with_a_syntax_error(tmp_path):
    message = refused(tmp_path, variant("def reference(inputs):", "def reference(inputs)"),
                      "raised SyntaxError while loading: ")
    line = MODERN.splitlines().index("def reference(inputs):") + 1
    assert message.endswith(f"expected ':' (problem.py, line {line})")


def test_a_failed_load_leaves_no_module_behind(tmp_path):
    import sys

    before = set(sys.modules)
    refused(tmp_path, "raise ValueError('x')\n", "raised ValueError while loading: x")
    load_problem(write(tmp_path, MODERN, "ok.py"))
    assert {m for m in set(sys.modules) - before if m.startswith("klineage_problem_")} == set()


# Numerics


def numerics(tmp_path, text) -> list[str]:
    return validate_numerics(load_problem(write(tmp_path, text)))


def test_outputs_near_zero(tmp_path):
    text = variant('return {"y": y, "sums": y.float().sum(dim=-1)}',
                   'return {"y": y * 1e-9, "sums": y.float().sum(dim=-1)}')
    (finding,) = numerics(tmp_path, text)
    assert finding.startswith("reference output 'y' is near zero (rms ")
    assert finding.endswith("): zeros would pass")


def test_outputs_exactly_zero(tmp_path):
    text = variant('return {"y": y, "sums"', 'return {"y": torch.zeros_like(y), "sums"')
    assert numerics(tmp_path, text) == ["reference output 'y' is near zero (rms 0.00e+00): zeros would pass"]


def test_outputs_insensitive_to_inputs(tmp_path):
    text = variant('"sums": y.float().sum(dim=-1)}', '"sums": torch.full((y.shape[0],), 3.0)}')
    assert numerics(tmp_path, text) == ["reference output 'sums' does not change with the inputs"]


def test_integer_outputs_insensitive_to_inputs(tmp_path):
    text = variant('"sums": {"shape": ["rows"], "dtype": "float32"}', '"sums": {"shape": ["rows"], "dtype": "int64"}')
    text = variant('"sums": y.float().sum(dim=-1)}', '"sums": torch.arange(y.shape[0])}', text)
    assert numerics(tmp_path, text) == ["reference output 'sums' does not change with the inputs"]


def test_inputs_not_depending_on_the_seed(tmp_path):
    text = variant("manual_seed(1234 + int(seed))", "manual_seed(1234)")
    findings = numerics(tmp_path, text)
    assert "inputs do not change with the seed" in findings
    # Same inputs for both seeds: the outputs cannot change either.
    assert "reference output 'y' does not change with the inputs" in findings


def test_inputs_not_reproducible_for_a_seed(tmp_path):
    text = variant("gen = torch.Generator().manual_seed(1234 + int(seed))", "gen = None")
    findings = numerics(tmp_path, text)
    assert findings == ["input 'a' differs between two calls with the same seed",
                        "input 'b' differs between two calls with the same seed"]


def test_non_finite_reference(tmp_path):
    text = variant('y = 2 * inputs["a"] + inputs["b"]', 'y = (2 * inputs["a"] + inputs["b"]) / 0')
    findings = numerics(tmp_path, text)
    assert "reference output 'y' is not finite for seed 0" in findings
    assert "reference output 'sums' is not finite for seed 0" in findings


def test_nan_reference(tmp_path):
    text = variant('"sums": y.float().sum(dim=-1)}', '"sums": y.float().sum(dim=-1).sqrt() * float("nan")}')
    assert numerics(tmp_path, text) == ["reference output 'sums' is not finite for seed 0"]


def test_reference_with_the_wrong_shape(tmp_path):
    text = variant('"sums": y.float().sum(dim=-1)}', '"sums": y.float().sum()}')
    assert numerics(tmp_path, text) == ["reference output 'sums' has shape (), OUTPUTS says (4,)"]


def test_make_inputs_returning_no_tensors(tmp_path):
    text = variant('return {"a": a.to(device), "b": b.to(device)}', 'return [a, b]')
    assert numerics(tmp_path, text) == ["make_inputs must return a non-empty dict of name -> tensor (case 'small')"]


def test_numerics_run_the_smallest_case(tmp_path):
    # Only the smallest case ("small", 4 x 8) runs: a reference broken for larger rows is not reached.
    text = variant('y = 2 * inputs["a"] + inputs["b"]', 'y = 2 * inputs["a"] + inputs["b"]\n'
                   '    assert y.shape[0] == 4, "ran a case other than the smallest"')
    assert numerics(tmp_path, text) == []


def test_reference_missing_an_output(tmp_path):
    problem = load_problem(write(tmp_path, variant('return {"y": y, "sums"', 'return {"why": y, "sums"')))
    with pytest.raises(DocumentError, match=r"^reference: did not return outputs \['y'\]$"):
        problem.reference(problem.make_inputs({"rows": 1, "cols": 1, "dtype": "float32"}, 0, "cpu"))


def test_vendor_returning_too_many_outputs(tmp_path):
    problem = load_problem(write(tmp_path, variant("return y, y.float().sum(dim=-1)", "return y, y, y")))
    with pytest.raises(DocumentError, match=r"^vendor: returned 3 outputs, OUTPUTS declares 2$"):
        problem.vendor(problem.make_inputs({"rows": 1, "cols": 1, "dtype": "float32"}, 0, "cpu"))


# The legacy format


def test_legacy_format_loads_as_one_case(tmp_path):
    path = write(tmp_path, LEGACY, "legacy_add.py")
    problem = load_problem(path)
    info = problem.info
    assert info.legacy
    assert info.operator == "legacy_add"  # no OPERATOR: the file's name
    assert [c.name for c in info.cases] == [LEGACY_CASE] == ["default"]
    assert info.cases[0].params == {}
    assert info.headline == "default"
    assert [o.to_dict() for o in info.outputs] == [
        {"name": "out0", "shape": [37, 2], "dtype": "float32"},
        {"name": "out1", "shape": [1], "dtype": "float32"},  # a 0-d result counts as one element
    ]
    assert info.roofline == {"default": {"flops": 0.0, "bytes": float(4 * (37 + 74 + 74 + 1))}}
    assert (info.has_vendor, info.has_check) == (False, False)
    assert info.tolerances["float32"] == Tolerance(1e-2, 1e-2, 1e-2)

    inputs = problem.make_inputs({}, 5, "cpu")
    assert list(inputs) == ["in0", "in1"]
    assert inputs["in0"].shape == (37,) and inputs["in1"].shape == (37, 2)
    outputs = problem.reference(inputs)
    assert list(outputs) == ["out0", "out1"]
    torch.testing.assert_close(outputs["out0"], inputs["in0"].unsqueeze(1) + inputs["in1"])
    assert validate_numerics(problem) == []


def test_legacy_operator_declared(tmp_path):
    info = load_problem(write(tmp_path, 'OPERATOR = "add_mul"\n' + LEGACY)).info
    assert info.operator == "add_mul"


def test_legacy_make_inputs_arity(tmp_path):
    text = variant("def make_inputs(seed, device)", "def make_inputs(case, seed, device)", LEGACY)
    refused(tmp_path, text, "'make_inputs' must take 2 positional parameters, takes 3")


def test_legacy_that_raises(tmp_path):
    text = variant("return a.unsqueeze(1) + b", "raise ValueError('shapes')\n    return a", LEGACY)
    refused(tmp_path, text, "legacy make_inputs/torch_ref raised ValueError: shapes")


def test_legacy_that_returns_non_tensors(tmp_path):
    text = variant("return a.unsqueeze(1) + b, (a * b[:, 0]).sum()", "return 1.0", LEGACY)
    refused(tmp_path, text, "legacy make_inputs and torch_ref must produce tensors")


def test_output_spec_direct():
    spec = OutputSpec.from_dict("y", {"shape": ["cdiv(n, 4)", 2], "dtype": "kind"}, "where")
    assert spec.resolve({"n": 10, "kind": "bfloat16"}) == ((3, 2), "bfloat16")
    with pytest.raises(DocumentError, match="dtype 'int4' is not one of"):
        spec.resolve({"n": 10, "kind": "int4"})


def test_reference_may_take_the_case(tmp_path):
    """A reference whose answer depends on a parameter (top-k's k) receives the case parameters."""
    text = variant("def reference(inputs)", "def reference(inputs, case)")
    problem = load_problem(write(tmp_path, text))
    sample = problem.make_inputs(dict(problem.info.case("small").params), 0, "cpu")
    outputs = problem.reference(sample, dict(problem.info.case("small").params))
    assert set(outputs) == {o.name for o in problem.info.outputs}
    with pytest.raises(DocumentError, match="takes the case parameters"):
        problem.reference(sample)
