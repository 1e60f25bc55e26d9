"""Kernel states: constants parsed from CUDA source, content fingerprints, documents and loading."""

import json
from pathlib import Path

import pytest

from klineage.errors import DocumentError
from klineage.kernel import KernelState, load_kernel, parse_constants
from klineage.launch import LaunchPlan

PLAN_TOML = """\
name = "scale_rows"
problem = "scale"

[[launch]]
entry = "scale_rows"
grid = ["cdiv(rows, ROWS_PER_BLOCK)"]
block = ["THREADS"]
args = ["x", "y", { scalar = "rows" }]
"""

SOURCE = """\
#include <cstdint>

constexpr int THREADS = 256;
constexpr int ROWS_PER_BLOCK = THREADS / 32;

extern "C" __global__ void scale_rows(const float* x, float* y, int rows) {
    int row = blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / 32;
    if (row < rows) y[row] = 2.0f * x[row];
}
"""


def plan(text: str = PLAN_TOML) -> LaunchPlan:
    return LaunchPlan.from_toml(text)


def state(source: str = SOURCE, text: str = PLAN_TOML) -> KernelState:
    return KernelState(source=source, plan=plan(text))


# parse_constants


def test_constexpr_forms():
    source = """
constexpr int A = 128;
static constexpr unsigned B = 64;
const int C = 4;
  constexpr size_t D = 1024;
static constexpr unsigned int E = 3;
constexpr long long F = 7;
constexpr int64_t G = 9;
constexpr uint32_t H = 11;
const float SCALE = 0.5;
constexpr double HALF = 0.5e0;
"""
    assert parse_constants(source) == {"A": 128, "B": 64, "C": 4, "D": 1024, "E": 3, "F": 7, "G": 9, "H": 11,
                                       "SCALE": 0.5, "HALF": 0.5}


def test_defines():
    source = """
#define BLOCK 256
#  define WARPS (BLOCK / 32)
#define TILE 16 // the tile edge
#define PI 3.14159f
"""
    assert parse_constants(source) == {"BLOCK": 256, "WARPS": 8, "TILE": 16, "PI": pytest.approx(3.14159)}


def test_literal_suffixes_are_stripped():
    source = """
constexpr unsigned A = 4u;
constexpr unsigned long long B = 8ull;
constexpr long C = 16L;
constexpr unsigned long D = 32UL;
constexpr long long E = 64LLU;
constexpr float F = 1.0f;
constexpr float G = 2.F;
constexpr float H = .5f;
constexpr float I = 1e-3f;
constexpr unsigned J = 0xFFu;
"""
    constants = parse_constants(source)
    assert constants == {"A": 4, "B": 8, "C": 16, "D": 32, "E": 64, "F": 1.0, "G": 2.0, "H": 0.5, "I": 0.001,
                         "J": 255}
    assert all(type(constants[k]) is int for k in "ABCDEJ")
    assert all(type(constants[k]) is float for k in "FGHI")


def test_hex_digits_are_not_suffixes():
    # 'F' is a hex digit here, not a float suffix; 'L' and 'U' inside names are not suffixes either.
    source = """
constexpr int MASK = 0x1F;
constexpr int LOW = 0xf;
constexpr int TILE_2 = 2;
constexpr int TILE_2U = 4;
constexpr int TILE_2F = 6;
constexpr int X = TILE_2U * 2;
constexpr int Y = TILE_2F + 1;
"""
    constants = parse_constants(source)
    assert constants["MASK"] == 31
    assert constants["LOW"] == 15
    assert constants["X"] == 8
    assert constants["Y"] == 7


def test_dependent_constants_in_source_order():
    source = """
constexpr int WARP = 32;
constexpr int WARPS = 8;
#define THREADS (WARP * WARPS)
constexpr int SMEM = THREADS * 4 + 16;
constexpr int PAD = max(SMEM, 2048);
"""
    assert parse_constants(source) == {"WARP": 32, "WARPS": 8, "THREADS": 256, "SMEM": 1040, "PAD": 2048}


def test_a_constant_used_before_its_definition_is_skipped():
    source = "constexpr int A = B * 2;\nconstexpr int B = 4;\n"
    assert parse_constants(source) == {"B": 4}


def test_c_integer_division():
    source = """
constexpr int A = 7 / 2;
constexpr int B = 1000 / 3 * 3;
constexpr float C = 7.0 / 2;
constexpr float D = 7 / 2.0f;
constexpr float E = 1e1 / 4;
"""
    assert parse_constants(source) == {"A": 3, "B": 999, "C": 3.5, "D": 3.5, "E": 2.5}


def test_division_by_a_float_constant_is_not_integer_division():
    source = "constexpr float S = 1.5f;\nconstexpr float T = S / 2;\nconstexpr int N = 9;\nconstexpr int Q = N / 2;\n"
    assert parse_constants(source) == {"S": 1.5, "T": 0.75, "N": 9, "Q": 4}


def test_names_and_hex_digits_do_not_look_like_float_literals():
    # 'E2' in a name and 'e5' in a hex literal are not exponents: division stays integral.
    source = "constexpr int SIZE2 = 5;\nconstexpr int Q = SIZE2 / 2;\nconstexpr int H = 0x1e5 / 2;\n"
    assert parse_constants(source) == {"SIZE2": 5, "Q": 2, "H": 242}


def test_casts_calls_and_templates_are_skipped():
    source = """
constexpr int A = static_cast<int>(4);
constexpr int B = (int)8;
constexpr int C = sizeof(float4);
constexpr int D = std::max(1, 2);
constexpr int E = foo(3);
constexpr int F = some_template<int>::value;
constexpr bool G = true;
constexpr bool H = 4 > 2;
constexpr int OK = 5;
#define CALL(x) ((x) * 2)
#define STR "hello"
#define ALSO_OK 6
"""
    assert parse_constants(source) == {"OK": 5, "ALSO_OK": 6}


def test_empty_define_does_not_swallow_the_next_line():
    source = "#define USE_FAST_PATH\n#define BLOCK 256\n#pragma once\nconstexpr int N = BLOCK * 2;\n"
    assert parse_constants(source) == {"BLOCK": 256, "N": 512}


def test_only_line_starting_declarations_count():
    source = """
__global__ void k() {
    int x = 5; // a local, not a constant
    y = 3;
}
  // constexpr int COMMENTED = 1; is not at the line start
constexpr int REAL = 2;
"""
    assert parse_constants(source) == {"REAL": 2}


def test_trailing_comments_are_ignored():
    assert parse_constants("constexpr int A = 4; // four\n#define B 8 // eight\n") == {"A": 4, "B": 8}


def test_state_constants_come_from_its_source():
    assert state().constants == {"THREADS": 256, "ROWS_PER_BLOCK": 8}


# Fingerprints


def test_fingerprint_is_stable_under_line_endings_and_trailing_blanks():
    base = state()
    crlf = state(SOURCE.replace("\n", "\r\n"))
    cr = state(SOURCE.replace("\n", "\r"))
    trailing = state("\n".join(line + "   \t" for line in SOURCE.split("\n")) + "\n\n\n")
    assert len(base.fingerprint) == 64
    assert crlf.fingerprint == base.fingerprint
    assert cr.fingerprint == base.fingerprint
    assert trailing.fingerprint == base.fingerprint


def test_fingerprint_changes_with_a_real_edit():
    base = state()
    edits = [
        SOURCE.replace("THREADS = 256", "THREADS = 128"),
        SOURCE.replace("2.0f * x[row]", "2.0f*x[row]"),  # whitespace inside a line is content
        SOURCE.replace("#include <cstdint>\n", "#include <cstdint>\n\n"),  # an inner blank line is content
        "    " + SOURCE,  # leading indentation is content
    ]
    prints = {base.fingerprint} | {state(s).fingerprint for s in edits}
    assert len(prints) == len(edits) + 1
    assert base.with_source(edits[0]).fingerprint == state(edits[0]).fingerprint
    assert base.with_source(edits[0]).plan is base.plan


@pytest.mark.parametrize(
    "old, new",
    [
        ('grid = ["cdiv(rows, ROWS_PER_BLOCK)"]', 'grid = ["cdiv(rows, ROWS_PER_BLOCK) + 1"]'),
        ('block = ["THREADS"]', 'block = ["THREADS", 1]\nshared = 16'),
        ('name = "scale_rows"', 'name = "scale_rows_v2"'),
        ('problem = "scale"', 'problem = "scale"\nnvcc_flags = ["-O2"]'),
        ('{ scalar = "rows" }', '{ scalar = "rows", type = "i64" }'),
    ],
)
def test_fingerprint_changes_with_a_plan_change(old, new):
    assert old in PLAN_TOML
    assert state(text=PLAN_TOML.replace(old, new)).fingerprint != state().fingerprint


def test_fingerprint_ignores_plan_formatting():
    reformatted = PLAN_TOML.replace('grid = ["cdiv(rows, ROWS_PER_BLOCK)"]', "grid = [ 'cdiv(rows, ROWS_PER_BLOCK)' ]")
    assert state(text=reformatted + "\n# a comment\n").fingerprint == state().fingerprint


# Documents


def test_to_dict_from_dict_round_trip():
    original = state()
    data = json.loads(json.dumps(original.to_dict()))
    assert data["version"] == 1
    assert data["fingerprint"] == original.fingerprint
    assert data["source"] == SOURCE
    again = KernelState.from_dict(data)
    assert again == original
    assert again.fingerprint == original.fingerprint
    assert again.name == "scale_rows"


def test_from_dict_without_a_fingerprint_is_accepted():
    data = state().to_dict()
    del data["fingerprint"]
    assert KernelState.from_dict(data).fingerprint == state().fingerprint


def test_tampered_fingerprint_is_refused():
    data = state().to_dict()
    data["source"] = data["source"].replace("2.0f", "3.0f")
    with pytest.raises(DocumentError) as info:
        KernelState.from_dict(data, "lineage/step3")
    assert str(info.value) == "lineage/step3: fingerprint does not match its source and plan"


def test_tampered_plan_is_refused():
    data = state().to_dict()
    data["plan"]["launch"][0]["block"] = [512, 1, 1]
    with pytest.raises(DocumentError, match="fingerprint does not match"):
        KernelState.from_dict(data)


def test_from_dict_refusals():
    with pytest.raises(DocumentError, match="kernel state: needs 'source' and 'plan'"):
        KernelState.from_dict({"source": SOURCE})
    with pytest.raises(DocumentError, match="kernel state: needs 'source' and 'plan'"):
        KernelState.from_dict("text")
    data = state().to_dict()
    data["version"] = 2
    with pytest.raises(DocumentError, match="unsupported version 2"):
        KernelState.from_dict(data)
    data = state().to_dict()
    data["plan"]["arch"] = "sm_80"
    with pytest.raises(DocumentError, match=r"^kernel state\.plan: arch must be one of"):
        KernelState.from_dict(data)


def test_empty_source_is_refused():
    with pytest.raises(DocumentError, match="^scale_rows: kernel source is empty$"):
        state(" \n\t\n")


# Loading from disk


def write_kernel(folder: Path, source: bytes | str = SOURCE, plan_text: str = PLAN_TOML, name: str = "kernel.cu"):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "launch.toml").write_text(plan_text, encoding="utf-8")
    if isinstance(source, str):
        source = source.encode("utf-8")
    (folder / name).write_bytes(source)
    return folder


def test_load_kernel_from_folder_and_from_plan_file(tmp_path):
    folder = write_kernel(tmp_path / "k")
    loaded = load_kernel(folder)
    assert loaded.source == SOURCE
    assert loaded.fingerprint == state().fingerprint
    assert load_kernel(folder / "launch.toml") == loaded
    assert load_kernel(str(folder)) == loaded


def test_load_kernel_uses_the_plans_source_name(tmp_path):
    folder = write_kernel(tmp_path / "k", plan_text='source = "rows.cu"\n' + PLAN_TOML, name="rows.cu")
    assert load_kernel(folder).plan.source == "rows.cu"


def test_load_kernel_missing_folder(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DocumentError) as info:
        load_kernel(missing)
    assert str(info.value) == f"{missing}: no launch.toml found"


def test_load_kernel_folder_without_plan(tmp_path):
    (tmp_path / "k").mkdir()
    with pytest.raises(DocumentError, match="no launch.toml found"):
        load_kernel(tmp_path / "k")


def test_load_kernel_missing_source(tmp_path):
    folder = write_kernel(tmp_path / "k", name="other.cu")
    with pytest.raises(DocumentError) as info:
        load_kernel(folder)
    assert str(info.value) == f"{folder / 'launch.toml'}: source file 'kernel.cu' not found next to the plan"


def test_load_kernel_non_utf8_source(tmp_path):
    folder = write_kernel(tmp_path / "k", source=b"constexpr int A = 1; // caf\xe9\n")
    with pytest.raises(DocumentError) as info:
        load_kernel(folder)
    assert str(info.value) == f"{folder / 'kernel.cu'}: source is not UTF-8 (byte 27)"


def test_load_kernel_bad_plan_names_the_plan_file(tmp_path):
    folder = write_kernel(tmp_path / "k", plan_text=PLAN_TOML.replace('problem = "scale"\n', ""))
    with pytest.raises(DocumentError) as info:
        load_kernel(folder)
    assert str(info.value) == f"{folder / 'launch.toml'}: missing 'problem'"
