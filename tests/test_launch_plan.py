"""Launch plans: parsing, refusal of malformed plans, and resolution for one case."""

import copy
import json
import tomllib
from pathlib import Path

import pytest

import klineage.launch as launch_module
from klineage.errors import DocumentError, ExpressionError
from klineage.launch import Arg, ArgKind, Launch, LaunchPlan, ResolvedLaunch, Scratch, TensorMap, numeric, resolve

FIXTURE = Path(__file__).parent / "fixtures" / "documents" / "full_plan.toml"
ENV = {"M": 1000, "N": 512, "K": 256, "SPLIT": 4, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "alpha": 1.5}
BUFFERS = {"a", "b", "c", "partial", "flags"}


def full() -> dict:
    return tomllib.loads(FIXTURE.read_text(encoding="utf-8"))


def minimal(**extra) -> dict:
    data = {"name": "k", "problem": "p", "launch": [{"entry": "kern", "grid": ["N"], "block": [256]}]}
    data.update(extra)
    return data


def refused(data, *fragments) -> DocumentError:
    with pytest.raises(DocumentError) as info:
        LaunchPlan.from_dict(data, "plan.toml")
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return info.value


# A full plan


def test_full_plan_parses_every_field():
    plan = LaunchPlan.from_file(FIXTURE)
    assert plan.name == "gemm_split_k"
    assert plan.problem == "gemm"
    assert plan.source == "gemm.cu"
    assert plan.arch == "sm_90a"
    assert plan.supports == "K % 8 == 0 and is_pow2(SPLIT)"
    assert plan.supports_reason.startswith("16-byte vector loads")
    assert plan.nvcc_flags == ("-O3", "--use_fast_math", "-lineinfo", "-maxrregcount=128", "-DUSE_TMA=1", "-Xptxas=-O3")
    assert plan.description.startswith("Split-K GEMM")
    assert plan.scratch == (
        Scratch("partial", "float32", "SPLIT * M * N", "zero"),
        Scratch("flags", "int32", 64, "poison"),
    )
    first, second = plan.launches
    assert first.entry == "gemm_partial"
    assert first.grid == ("cdiv(N, BLOCK_N)", "cdiv(M, BLOCK_M)", "SPLIT")
    assert first.block == (128, 2, 1)
    assert first.shared == "(BLOCK_M + BLOCK_N) * BLOCK_K * 2"
    assert first.args[:3] == (Arg(ArgKind.BUFFER, name="a"), Arg(ArgKind.BUFFER, name="b"),
                              Arg(ArgKind.BUFFER, name="partial"))
    assert first.args[5] == Arg(ArgKind.SCALAR, value="K", type="i64")
    assert second.grid == ("cdiv(M * N, 256)", 1, 1)
    assert second.block == (256, 1, 1)
    assert second.shared == 0
    assert second.args[2] == Arg(ArgKind.SCALAR, value="M * N", type="i32")  # i32 by default
    assert second.args[3] == Arg(ArgKind.SCALAR, value=0.5, type="f64")


def test_full_plan_round_trips_through_dicts():
    plan = LaunchPlan.from_file(FIXTURE)
    data = plan.to_dict()
    again = LaunchPlan.from_dict(data)
    assert again == plan
    assert again.to_dict() == data
    assert data["launch"][0]["args"][0] == {"buffer": "a"}
    assert data["launch"][0]["args"][6] == {"scalar": "alpha", "type": "f32"}
    assert data["launch"][1]["grid"] == ["cdiv(M * N, 256)", 1, 1]
    assert data["scratch"][1] == {"name": "flags", "dtype": "int32", "count": 64, "init": "poison"}


def test_defaults_of_a_minimal_plan():
    plan = LaunchPlan.from_dict(minimal())
    assert (plan.source, plan.arch, plan.supports, plan.nvcc_flags, plan.scratch) == ("kernel.cu", "sm_90", "", (), ())
    assert plan.launches == (Launch("kern", ("N", 1, 1), (256, 1, 1), 0, ()),)
    assert plan.supports_case({"N": 3})


def test_supports_case_evaluates_the_predicate_over_numeric_params():
    plan = LaunchPlan.from_file(FIXTURE)
    assert plan.supports_case({"K": 64, "SPLIT": 4, "dtype": "float16"})
    assert not plan.supports_case({"K": 60, "SPLIT": 4})
    assert not plan.supports_case({"K": 64, "SPLIT": 3})
    assert numeric({"K": 1, "x": 2.5, "b": True, "dtype": "float16"}) == {"K": 1, "x": 2.5, "b": True}


# Malformed plans


@pytest.mark.parametrize("key", ["name", "problem", "launch"])
def test_missing_required_key(key):
    data = minimal()
    del data[key]
    refused(data, "plan.toml: ", f"missing '{key}'")


def test_unknown_top_level_key():
    refused(minimal(threads=256), "unknown keys ['threads']", "allowed: ")


def test_unknown_launch_key():
    data = minimal()
    data["launch"][0]["stream"] = 1
    err = refused(data, "plan.toml.launch[0]", "unknown keys ['stream']")
    assert err.where == "plan.toml.launch[0]"


def test_unknown_scratch_and_arg_keys():
    refused(minimal(scratch=[{"name": "s", "dtype": "f32", "count": 4, "size": 4}]), "plan.toml.scratch[0]",
            "unknown keys ['size']")
    data = minimal()
    data["launch"][0]["args"] = ["x", {"scalar": "N", "type": "i32", "const": True}]
    refused(data, "plan.toml.launch[0].args[1]", "unknown keys ['const']")


@pytest.mark.parametrize("arch", ["sm_80", "sm_100", "compute_90", 90])
def test_bad_arch(arch):
    refused(minimal(arch=arch), f"arch must be one of sm_90, sm_90a, not {arch!r}")


def test_supports_needs_a_reason():
    refused(minimal(supports="N % 4 == 0"), "'supports' needs a 'supports_reason'")
    plan = LaunchPlan.from_dict(minimal(supports="N % 4 == 0", supports_reason="float4 loads"))
    assert plan.supports_reason == "float4 loads"


def test_supports_with_a_bad_expression_names_the_field():
    refused(minimal(supports="N.real > 1", supports_reason="x"), "plan.toml.supports", "'Attribute' is not allowed")


@pytest.mark.parametrize(
    "flag",
    [
        "-I/etc",
        "-isystem/usr/include",
        "--output-file=/tmp/x.cubin",
        "-o",
        "-Xcompiler",
        "-Xcompiler=-fplugin=/tmp/evil.so",
        "-O3;rm -rf /",
        "-O3 -I/etc",
        "-DX=$(id)",
        "-DX=`id`",
        "-O3|cat",
        "-O3&",
        "-O3\n-I/etc",
        "-Xptxas=-O3,--output-file=/tmp/x",  # ptxas takes a comma-separated list
        "--include-path=/etc",
        "-ccbin=/tmp/cc",
        "--keep",
        "",
    ],
)
def test_disallowed_nvcc_flags(flag):
    refused(minimal(nvcc_flags=["-O3", flag]), f"nvcc flag {flag!r} is not allowed")


def test_nvcc_flags_must_be_a_list_of_strings():
    refused(minimal(nvcc_flags="-O3"), "nvcc_flags must be a list of strings")
    refused(minimal(nvcc_flags=["-O3", 3]), "nvcc_flags must be a list of strings")


def test_allowed_nvcc_flags():
    flags = ["-O2", "--use_fast_math", "-lineinfo", "-maxrregcount=64", "-DTILE=64", "--ftz=true",
             "--prec-div=false", "--prec-sqrt=false", "--fmad=true", "-Xptxas=-O3", "--extra-device-vectorization"]
    assert LaunchPlan.from_dict(minimal(nvcc_flags=flags)).nvcc_flags == tuple(flags)


@pytest.mark.parametrize(
    "grid, fragment",
    [
        (["cdiv(N,"], "syntax error"),
        (["N.shape"], "'Attribute' is not allowed"),
        (["open(N)"], "unknown function"),
        (["'N'"], "only numbers are allowed as literals"),
    ],
)
def test_grid_with_a_bad_expression(grid, fragment):
    data = minimal()
    data["launch"][0]["grid"] = grid
    err = refused(data, "plan.toml.launch[0].grid", fragment)
    assert isinstance(err, ExpressionError)


@pytest.mark.parametrize("grid", [[1.5], [True], [], [1, 2, 3, 4], {"x": 1}, [None]])
def test_grid_with_bad_values(grid):
    data = minimal()
    data["launch"][0]["grid"] = grid
    refused(data, "plan.toml.launch[0].grid")


def test_shared_with_a_bad_value():
    data = minimal()
    data["launch"][0]["shared"] = 1.5
    refused(data, "plan.toml.launch[0].shared", "must be a whole number or an expression, not 1.5")
    data["launch"][0]["shared"] = "N +"
    refused(data, "plan.toml.launch[0].shared", "syntax error")


@pytest.mark.parametrize("kind", ["i16", "float", "f16", "int", "bf16"])
def test_bad_scalar_type(kind):
    data = minimal()
    data["launch"][0]["args"] = [{"scalar": "N", "type": kind}]
    refused(data, "plan.toml.launch[0].args[0]", f"scalar type '{kind}' is not one of i32, u32, i64, u64, f32, f64")


@pytest.mark.parametrize("value", [True, [1], {"a": 1}])
def test_bad_scalar_value(value):
    data = minimal()
    data["launch"][0]["args"] = [{"scalar": value}]
    refused(data, "plan.toml.launch[0].args[0]", f"scalar must be a number or an expression, not {value!r}")


def test_scalar_with_a_bad_expression_names_the_argument():
    data = minimal()
    data["launch"][0]["args"] = ["x", {"scalar": "__import__('os')"}]
    refused(data, "plan.toml.launch[0].args[1]", "unknown function")


@pytest.mark.parametrize("name", ["1x", "a-b", "a b", "", "x;y", "a.b"])
def test_non_identifier_buffer_names(name):
    data = minimal()
    data["launch"][0]["args"] = [name]
    refused(data, "plan.toml.launch[0].args[0]", f"{name!r} is not a valid buffer name")
    data["launch"][0]["args"] = [{"buffer": name}]
    refused(data, "plan.toml.launch[0].args[0]", f"{name!r} is not a valid buffer name")
    refused(minimal(scratch=[{"name": name, "dtype": "float32", "count": 4}]), "plan.toml.scratch[0]",
            "is not a valid buffer name")


def test_argument_that_is_neither_buffer_nor_scalar():
    data = minimal()
    data["launch"][0]["args"] = [{"type": "i32"}]
    refused(data, "an argument table needs 'buffer', 'scalar' or 'tensor_map'")
    data["launch"][0]["args"] = [3]
    refused(data, "an argument is a buffer name or a table, not 3")


@pytest.mark.parametrize("source", ["../kernel.cu", "/etc/passwd", "sub/kernel.cu", ".hidden.cu", 3])
def test_source_with_a_path(source):
    refused(minimal(source=source), "source must be a file name next to the plan")


def test_launch_count_limits():
    refused(minimal(launch=[]), "'launch' must list 1 to 16 launches")
    refused(minimal(launch={"entry": "k", "grid": 1, "block": 1}), "'launch' must list 1 to 16 launches")
    refused(minimal(launch=[{"entry": "k", "grid": 1, "block": 1}] * 17), "'launch' must list 1 to 16 launches")
    assert len(LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": 1}] * 16)).launches) == 16


def test_launch_needs_entry_grid_block():
    for key in ("entry", "grid", "block"):
        data = minimal()
        del data["launch"][0][key]
        refused(data, "plan.toml.launch[0]", f"launch needs '{key}'")
    data = minimal()
    data["launch"][0]["entry"] = "  "
    refused(data, "entry must name a __global__ function")


def test_too_many_args():
    data = minimal()
    data["launch"][0]["args"] = ["x"] * 65
    refused(data, "args must be a list of at most 64")


def test_scratch_validation():
    refused(minimal(scratch=[{"name": "s", "dtype": "float32"}]), "scratch buffer needs 'count'")
    refused(minimal(scratch=[{"name": "s", "dtype": "float32", "count": 4, "init": "random"}]),
            "scratch init must be one of ('poison', 'zero'), not 'random'")
    refused(minimal(scratch=[{"name": "s", "dtype": "float32", "count": "N +"}]), "plan.toml.scratch[0]",
            "syntax error")
    refused(minimal(scratch={"name": "s"}), "'scratch' must be a list of tables")


def test_plan_must_be_a_table():
    refused(["x"], "plan.toml: must be a table")


def test_invalid_toml_names_the_file():
    with pytest.raises(DocumentError, match=r"^mine\.toml: not valid TOML: "):
        LaunchPlan.from_toml('name = "x"\nname = "y"\n', "mine.toml")


def test_malformed_fixture_copy_is_refused_without_touching_the_original():
    data = full()
    broken = copy.deepcopy(data)
    broken["launch"][1]["args"][0] = "../x"
    refused(broken, "plan.toml.launch[1].args[0]", "'../x' is not a valid buffer name")
    LaunchPlan.from_dict(data)


# Resolution


def test_resolve_evaluates_every_expression():
    plan = LaunchPlan.from_file(FIXTURE)
    first, second = resolve(plan, {**ENV, "dtype": "float16"}, BUFFERS)
    assert first == ResolvedLaunch(
        entry="gemm_partial",
        grid=(4, 16, 4),
        block=(128, 2, 1),
        shared=(64 + 128) * 32 * 2,
        args=(("buffer", "a", ""), ("buffer", "b", ""), ("buffer", "partial", ""), ("scalar", 1000, "i32"),
              ("scalar", 512, "i32"), ("scalar", 256, "i64"), ("scalar", 1.5, "f32")),
    )
    assert second.grid == (2000, 1, 1)
    assert second.block == (256, 1, 1)
    assert second.shared == 0
    assert second.args == (("buffer", "partial", ""), ("buffer", "c", ""), ("scalar", 512000, "i32"),
                           ("scalar", 0.5, "f64"), ("buffer", "flags", ""))
    assert isinstance(second.args[3][1], float)
    assert ResolvedLaunch.from_dict(first.to_dict()) == first


def test_resolve_converts_scalars_to_their_type():
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": 32,
                                                 "args": [{"scalar": "N", "type": "f64"}, {"scalar": 7.0}]}]))
    (launch,) = resolve(plan, {"N": 3}, set())
    assert launch.args == (("scalar", 3.0, "f64"), ("scalar", 7, "i32"))
    assert type(launch.args[0][1]) is float and type(launch.args[1][1]) is int


@pytest.mark.parametrize(
    "block, fragment",
    [
        ([1024, 2], "block (1024, 2, 1) has more than 1024 threads"),
        ([32, 32, 2], "block (32, 32, 2) has more than 1024 threads"),
        ([2048], "block (2048, 1, 1) is outside the hardware limits"),
        ([1, 1, 65], "block (1, 1, 65) is outside the hardware limits"),
        ([0], "block (0, 1, 1) is outside the hardware limits"),
        (["N - 300"], "block (-44, 1, 1) is outside the hardware limits"),
    ],
)
def test_resolve_refuses_bad_blocks(block, fragment):
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": block}]))
    with pytest.raises(DocumentError) as info:
        resolve(plan, {"N": 256}, set())
    assert str(info.value) == f"k.launch[0] (k): {fragment}"


def test_resolve_accepts_exactly_1024_threads():
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": [32, 32]}]))
    assert resolve(plan, {}, set())[0].block == (32, 32, 1)


@pytest.mark.parametrize(
    "grid, fragment",
    [
        ([1, 65536], "grid (1, 65536, 1) is outside the hardware limits"),
        ([1, 1, "N * 1000"], "grid (1, 1, 100000) is outside the hardware limits"),
        (["2 ** 31"], "grid (2147483648, 1, 1) is outside the hardware limits"),
        (["N - 100"], "grid (0, 1, 1) is outside the hardware limits"),
    ],
)
def test_resolve_refuses_bad_grids(grid, fragment):
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": grid, "block": 1}]))
    with pytest.raises(DocumentError, match=r"^k\.launch\[0\] \(k\): ") as info:
        resolve(plan, {"N": 100}, set())
    assert fragment in str(info.value)


def test_resolve_accepts_the_largest_grid():
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": ["2 ** 31 - 1", 65535, 65535], "block": 1}]))
    assert resolve(plan, {}, set())[0].grid == (2**31 - 1, 65535, 65535)


def test_resolve_refuses_unknown_buffers_naming_known_ones():
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": 1, "args": ["x", "out"]}]))
    with pytest.raises(DocumentError) as info:
        resolve(plan, {}, {"x", "y", "scratch0"})
    assert str(info.value) == "k.launch[0] (k): unknown buffer 'out' (known: scratch0, x, y)"


def test_resolve_refuses_negative_shared():
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": 1, "shared": "N - 64"}]))
    with pytest.raises(DocumentError) as info:
        resolve(plan, {"N": 32}, set())
    assert str(info.value) == "k.launch[0] (k): dynamic shared memory is negative (-32)"
    assert resolve(plan, {"N": 64}, set())[0].shared == 0


def test_resolve_names_the_field_whose_expression_fails():
    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": ["cdiv(ROWS, 4)"], "block": 1}]))
    with pytest.raises(ExpressionError) as info:
        resolve(plan, {"N": 8, "dtype": "float32"}, set())
    assert str(info.value) == "k.launch[0] (k).grid: cdiv(ROWS, 4): unknown name 'ROWS' (known: N)"

    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": ["N / 3"]}]))
    with pytest.raises(ExpressionError, match=r"^k\.launch\[0\] \(k\)\.block: N / 3: must be a whole number"):
        resolve(plan, {"N": 8}, set())

    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": 1, "shared": "N // 0"}]))
    with pytest.raises(ExpressionError, match=r"^k\.launch\[0\] \(k\)\.shared: N // 0: division by zero$"):
        resolve(plan, {"N": 8}, set())

    plan = LaunchPlan.from_dict(minimal(launch=[{"entry": "k", "grid": 1, "block": 1,
                                                 "args": ["x", {"scalar": "Q"}]}]))
    with pytest.raises(ExpressionError, match=r"^k\.launch\[0\] \(k\)\.args\[1\]: Q: unknown name 'Q'"):
        resolve(plan, {"N": 8}, {"x"})


def test_resolve_names_the_failing_launch_among_several():
    plan = LaunchPlan.from_file(FIXTURE)
    with pytest.raises(DocumentError, match=r"^gemm_split_k\.launch\[1\] \(reduce_split\): unknown buffer 'flags'"):
        resolve(plan, ENV, BUFFERS - {"flags"})


# Tensor maps (TMA descriptors passed by value)


def tensor_map(**extra) -> dict:
    arg = {"tensor_map": "x", "dtype": "bf16", "dims": ["K", "M"], "strides": ["K * 2"],
           "box": ["BLOCK_K", "BLOCK_M"], "swizzle": "128B"}
    arg.update(extra)
    return arg


def tma_plan(*args, arch="sm_90a") -> dict:
    return {"name": "k", "problem": "p", "arch": arch,
            "launch": [{"entry": "kern", "grid": 1, "block": 384, "args": list(args) or [tensor_map(), "y"]}]}


TMA_ENV = {"M": 1000, "N": 512, "K": 256, "BLOCK_M": 128, "BLOCK_K": 64}


def test_tensor_map_argument_parses_with_defaults():
    plan = LaunchPlan.from_dict(tma_plan(tensor_map(), {"tensor_map": "W", "dtype": "f32", "dims": [4096],
                                                        "box": [64]}))
    first, second = plan.launches[0].args
    assert first == Arg(ArgKind.TENSOR_MAP, name="x", type="bf16", dims=("K", "M"), strides=("K * 2",),
                        box=("BLOCK_K", "BLOCK_M"), swizzle="128B", l2_promotion="256B")
    assert (second.dims, second.strides, second.box, second.swizzle, second.l2_promotion) == \
        ((4096,), (), (64,), "none", "256B")  # rank 1 has no strides; swizzle none and 256-byte L2 promotion
    assert first.to_dict() == {"tensor_map": "x", "dtype": "bf16", "dims": ["K", "M"], "strides": ["K * 2"],
                               "box": ["BLOCK_K", "BLOCK_M"], "swizzle": "128B", "l2_promotion": "256B"}
    assert LaunchPlan.from_dict(plan.to_dict()) == plan


def test_tensor_map_plan_from_toml_round_trips():
    text = """
name = "k"
problem = "gemm"
arch = "sm_90"
[[launch]]
entry = "kern"
grid = 1
block = 384
args = [
    { tensor_map = "x", dtype = "bf16", dims = ["K", "M", 2], strides = ["K * 2", "K * M * 2"], box = [32, 128, 1], swizzle = "64B", l2_promotion = "none" },
    "y",
]
"""  # noqa: E501  (TOML: an inline table must stay on one line)
    plan = LaunchPlan.from_toml(text)
    arg = plan.launches[0].args[0]
    assert (arg.dims, arg.strides, arg.box, arg.swizzle, arg.l2_promotion) == \
        (("K", "M", 2), ("K * 2", "K * M * 2"), (32, 128, 1), "64B", "none")
    assert LaunchPlan.from_dict(plan.to_dict()) == plan


def test_plans_without_tensor_maps_serialize_as_before():
    data = full()
    assert "tensor_map" not in str(LaunchPlan.from_dict(data).to_dict())
    assert LaunchPlan.from_dict(data).to_dict()["launch"][0]["args"][0] == {"buffer": "a"}


def test_tensor_map_resolves_to_numbers():
    plan = LaunchPlan.from_dict(tma_plan())
    (launch,) = resolve(plan, TMA_ENV, {"x", "y"})
    kind, name, spec = launch.args[0]
    assert (kind, name) == ("tensor_map", "x")
    assert spec == TensorMap("bf16", (256, 1000), (512,), (64, 128), "128B", "256B")
    assert spec.element_bytes == 2 and spec.extent_bytes == 1000 * 256 * 2
    assert launch.args[1] == ("buffer", "y", "")
    data = launch.to_dict()
    assert data["args"][0] == ["tensor_map", "x", {"dtype": "bf16", "dims": [256, 1000], "strides": [512],
                                                   "box": [64, 128], "swizzle": "128B", "l2_promotion": "256B"}]
    assert ResolvedLaunch.from_dict(json.loads(json.dumps(data))) == launch


def test_tensor_map_extent_follows_strides():
    # A padded 3-D map: 10 x 3 x 2 floats, rows 64 bytes apart, planes 256 bytes apart.
    spec = TensorMap("f32", (10, 3, 2), (64, 256), (8, 3, 2), "none", "none")
    assert spec.extent_bytes == 256 + 2 * 64 + 9 * 4 + 4


@pytest.mark.parametrize("extra, fragments", [
    ({"dtype": "bfloat16"}, ["tensor map dtype 'bfloat16' is not one of u8, u16, u32, i32"]),
    ({"dims": []}, ["tensor map rank must be 1 to 5, not 0"]),
    ({"dims": [1, 2, 3, 4, 5, 6], "box": [8] * 6, "strides": [16] * 5}, ["tensor map rank must be 1 to 5, not 6"]),
    ({"dims": "K"}, [".dims", "must be a list of expressions"]),
    ({"box": [64]}, ["box has 1 dimensions; dims has 2"]),
    ({"strides": []}, ["strides lists the byte strides of dims 1 .. rank-1: 1 expression(s) for rank 2, not 0"]),
    ({"strides": ["K * 2", 4096]}, ["for rank 2, not 2"]),
    ({"swizzle": "256B"}, ["swizzle '256B' is not one of none, 32B, 64B, 128B"]),
    ({"swizzle": 128}, ["swizzle 128 is not one of"]),
    ({"l2_promotion": "512B"}, ["l2_promotion '512B' is not one of none, 64B, 128B, 256B"]),
    ({"box": [64, 512]}, ["tensor map 'x': box[1] = 512 is outside 1 .. 256"]),
    ({"box": [64, 0]}, ["box[1] = 0 is outside 1 .. 256"]),
    ({"box": [128, 64]}, ["the box's inner extent is 256 bytes (128 x bf16); swizzle 128B allows at most 128"]),
    ({"box": [4, 64]}, ["the box's inner extent is 8 bytes (4 x bf16); it must be a multiple of 16"]),
    ({"box": [64, 64], "swizzle": "32B"}, ["swizzle 32B allows at most 32"]),
    ({"strides": [100]}, ["strides[0] = 100 bytes must be a positive multiple of 16 below 2**40"]),
    ({"strides": [2**40]}, ["must be a positive multiple of 16 below 2**40"]),
    ({"dims": [0, "M"]}, ["dims[0] = 0 is outside 1 .. 2**32"]),
    ({"dims": ["K +", "M"]}, [".dims", "syntax error"]),
    ({"box": [True, 64]}, [".box", "must be a whole number or an expression, not True"]),
    ({"stride": ["K * 2"]}, ["unknown keys ['stride']"]),
    ({"tensor_map": "x.y"}, ["'x.y' is not a valid buffer name"]),
])
def test_malformed_tensor_maps_are_refused(extra, fragments):
    refused(tma_plan(tensor_map(**extra)), "plan.toml.launch[0].args[0]", *fragments)


@pytest.mark.parametrize("key", ["dtype", "dims", "box"])
def test_tensor_map_required_keys(key):
    arg = tensor_map()
    del arg[key]
    refused(tma_plan(arg), "plan.toml.launch[0].args[0]", f"tensor map needs '{key}'")


def test_an_argument_table_names_its_kind():
    refused(tma_plan({"dtype": "bf16"}), "an argument table needs 'buffer', 'scalar' or 'tensor_map'")


def test_tensor_maps_only_for_hopper_plans(monkeypatch):
    monkeypatch.setattr(launch_module, "ARCHES", (*launch_module.ARCHES, "sm_80"))
    LaunchPlan.from_dict(tma_plan(arch="sm_90"))
    LaunchPlan.from_dict(tma_plan("x", {"scalar": "N"}, arch="sm_80"))  # no tensor map: any arch
    refused(tma_plan("y", tensor_map(), arch="sm_80"), "plan.toml.launch[0].args[1]",
            "tensor maps need arch sm_90 or sm_90a, not sm_80")


@pytest.mark.parametrize("env, fragment", [
    ({"BLOCK_M": 512}, "args[0]: tensor map 'x': box[1] = 512 is outside 1 .. 256"),
    ({"BLOCK_K": 128}, "args[0]: tensor map 'x': the box's inner extent is 256 bytes (128 x bf16); "
                       "swizzle 128B allows at most 128"),
    ({"K": 100}, "args[0]: tensor map 'x': strides[0] = 200 bytes must be a positive multiple of 16 below 2**40 "
                 "(TMA needs 16-byte aligned rows)"),
    ({"M": 0}, "args[0]: tensor map 'x': dims[1] = 0 is outside 1 .. 2**32"),
])
def test_resolve_checks_tensor_map_values(env, fragment):
    plan = LaunchPlan.from_dict(tma_plan())
    with pytest.raises(DocumentError) as info:
        resolve(plan, {**TMA_ENV, **env}, {"x", "y"})
    assert str(info.value) == f"k.launch[0] (kern).{fragment}"


def test_resolve_refuses_a_tensor_map_over_an_unknown_buffer():
    plan = LaunchPlan.from_dict(tma_plan())
    with pytest.raises(DocumentError) as info:
        resolve(plan, TMA_ENV, {"W", "y"})
    assert str(info.value) == "k.launch[0] (kern): tensor map over unknown buffer 'x' (known: W, y)"


def test_resolve_names_a_tensor_map_expression_that_fails():
    plan = LaunchPlan.from_dict(tma_plan(tensor_map(box=["BLOCK_Q", 128])))
    with pytest.raises(ExpressionError, match=r"^k\.launch\[0\] \(kern\)\.args\[0\]\.box: BLOCK_Q: unknown name"):
        resolve(plan, TMA_ENV, {"x", "y"})
