"""SASS features of real cubins: instruction classes as nvcc 13 emits them for sm_90/sm_90a."""

import json
from pathlib import Path

import pytest

from klineage.errors import DocumentError
from klineage.features.feature import Feature
from klineage.features.sass import FEATURES, SassFeatures, disassemble, sass_features
from klineage.gate.compile import CompileResult, compile_kernel
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan

KERNELS = Path(__file__).parent / "fixtures" / "kernels"


def kernel(file: str, entry: str, arch: str = "sm_90", flags: tuple[str, ...] = ()) -> KernelState:
    plan = LaunchPlan.from_toml(
        f'name = "{Path(file).stem}"\nproblem = "test"\narch = "{arch}"\nnvcc_flags = {json.dumps(list(flags))}\n'
        f'[[launch]]\nentry = "{entry}"\ngrid = 1\nblock = 32\n')
    return KernelState((KERNELS / file).read_text(), plan)


@pytest.fixture(scope="session")
def cache(tmp_path_factory) -> Path:
    path = tmp_path_factory.getbasetemp() / "compile-cache"
    path.mkdir(exist_ok=True)
    return path


def compiled(cache: Path, file: str, entry: str, **plan) -> CompileResult:
    result = compile_kernel(kernel(file, entry, **plan), cache)
    assert result.ok, result.log
    return result


def features_of(cache: Path, file: str, entry: str, target: str = "sm_90", **plan) -> SassFeatures:
    """Features of the `target` cubin; a plan for sm_90 (the default) builds sm_90 and sm_90a."""
    return sass_features(compiled(cache, file, entry, **plan).cubin_bytes(target))


def test_feature_table_names():
    assert set(FEATURES) == {
        "ldg_128", "ldg_64", "ldg_32", "ldg_const", "stg_128", "stg_64", "ldgsts", "ldsm", "stsm", "hmma",
        "hgmma", "imma", "shfl", "bar_sync", "lds", "sts", "ldl", "stl", "utmaldg", "utmastg", "mbarrier",
        "mufu", "ffma", "atom", "red", "atoms"}


def test_vector_copies(cache):
    found = features_of(cache, "copy.cu", "copy_float4")
    assert found.names("copy_float4") == {"ldg_128", "ldg_const", "stg_128"}  # const __restrict__: read-only path
    assert found.names("twice_double") == {"ldg_64", "stg_64"}
    assert found.count("ldg_128", "copy_float4") == 1


def test_cp_async_ldmatrix_mma(cache):
    for arch in ("sm_90", "sm_90a"):
        found = features_of(cache, "mma_bf16.cu", "mma_tile", target=arch)
        names = found.names("mma_tile")
        assert {"ldgsts", "ldsm", "hmma", "bar_sync"} <= names
        assert found.count("ldgsts") == 2 and found.count("ldsm") == 2 and found.count("hmma") == 1
        # ptxas pads cp.async with "@!PT LDS RZ, [RZ]" dummies that never run: they are not counted.
        assert "lds" not in names


def test_shuffle_reduction(cache):
    found = features_of(cache, "warp_sum.cu", "warp_sum")
    assert found.count("shfl", "warp_sum") == 5  # offsets 16, 8, 4, 2, 1
    assert found.count("red", "warp_sum") == 1  # atomicAdd whose result is unused


def test_atomics_special_functions_stmatrix_imma(cache):
    found = features_of(cache, "misc_ops.cu", "histogram")
    assert {"atoms", "atom", "bar_sync", "lds", "sts", "ldg_32", "ldg_const"} <= found.names("histogram")
    assert {"ffma", "mufu"} <= found.names("axpy_exp")
    assert "stsm" in found.names("store_matrix")
    assert "imma" in found.names("int8_mma")


def test_local_memory(cache):
    found = features_of(cache, "local_array.cu", "local_array", flags=("-maxrregcount=32",))
    assert found.count("stl", "local_array") > 0 and found.count("ldl", "local_array") > 0


def test_hopper_tma_mbarrier_wgmma(cache):
    found = features_of(cache, "hopper.cu", "tma_roundtrip", target="sm_90a", arch="sm_90a")
    assert {"utmaldg", "utmastg", "mbarrier", "bar_sync"} <= found.names("tma_roundtrip")
    assert found.count("hgmma", "wgmma_tile") == 1


def test_disassemble_demangles_and_strips_encodings(cache):
    result = compiled(cache, "templates.cu", "scale<128>")
    listing = disassemble(result.cubin_bytes())
    assert set(listing) == set(result.entries)
    body = listing["void scale<128>(float*, float)"]
    assert any(line.startswith("LDG.E") for line in body)
    assert all("/*" not in line and not line.endswith(";") for line in body)
    assert disassemble(Path(result.cubin_paths["sm_90"])) == listing
    loci = sass_features(result.cubin_bytes()).loci
    assert {"void scale<128>(float*, float)", "void scale<64>(float*, float)"} <= set(loci)


def test_missing_cubin_file(tmp_path):
    with pytest.raises(DocumentError, match="cubin file not found"):
        disassemble(tmp_path / "none.cubin")


def test_sass_features_round_trip(cache):
    found = features_of(cache, "copy.cu", "copy_float4")
    data = json.loads(json.dumps(found.to_dict()))
    assert SassFeatures.from_dict(data) == found
    assert data["counts"][0] == {"locus": "copy_float4", "name": "ldg_128", "count": 1}
    assert Feature("copy_float4", "ldg_128") in found.features
    with pytest.raises(DocumentError, match="counts\\[0\\]"):
        SassFeatures.from_dict({"counts": [{"locus": "k", "name": "shfl"}]})


def test_feature_document():
    feature = Feature("gemm<128, 64>", "hmma")
    assert Feature.from_dict(feature.to_dict()) == feature
    assert str(feature) == "gemm<128, 64>:hmma"
    assert sorted([Feature("b", "a"), Feature("a", "z"), Feature("a", "b")]) == [
        Feature("a", "b"), Feature("a", "z"), Feature("b", "a")]
    with pytest.raises(DocumentError, match="exactly 'locus' and 'name'"):
        Feature.from_dict({"locus": "k"})
    with pytest.raises(DocumentError, match="non-empty name"):
        Feature("k", "")
