"""The gate's verdict cache, its recorded store for replay, verdict documents and the gate policy."""

import gzip
import json

import pytest

from klineage.documents import gzip_packed
from klineage.errors import DocumentError, KLineageError, ReplayMiss
from klineage.gate.cache import PLAIN, GateCache, VerdictStore, verdict_key
from klineage.gate.policy import QUICK, STRICT, GatePolicy, Placement, Sanitize, TimingScope
from klineage.gate.timing import PairedRatio, TimingStats
from klineage.gate.verdict import GATE_VERSION, VERDICT_VERSION, Finding, Reason, Status, Verdict

KERNEL = "a" * 64
PROBLEM = "b" * 64
POLICY = GatePolicy().fingerprint

KEY_PARTS = dict(kernel=KERNEL, problem=PROBLEM, cases=["small", "headline"], gpu="NVIDIA H200",
                 toolchain="nvcc 12.8 / driver 570.86", policy=POLICY, against="c" * 64, mode="full")


def key(**changes) -> str:
    return verdict_key(**{**KEY_PARTS, **changes})[0]


def rejected() -> Verdict:
    candidate = TimingStats.of([[10.0, 10.5, 11.0], [10.2, 10.4], [9.9, 10.1, 10.3]])
    baseline = TimingStats.of([[20.0, 21.0], [20.5, 20.7], [19.8, 20.2]])
    return Verdict(
        status=Status.REJECTED,
        kernel={"name": "row_softmax_warp_vec4", "fingerprint": KERNEL},
        problem={"operator": "row_softmax", "fingerprint": PROBLEM},
        cases=("small", "headline"),
        policy=GatePolicy().to_dict(),
        findings=(
            Finding(Reason.INCORRECT, "correctness", "max |out - ref| 3.2e-2 > 1e-4", "headline",
                    {"max_abs": 0.032, "index": [17, 4001], "seed": 1}),
            Finding(Reason.MEMCHECK, "sanitize", "Invalid __global__ write of size 4", "small",
                    {"tool": "memcheck", "errors": 3}),
            Finding(Reason.STATIC_CHECK, "static", "asm clock64 read: a timer", ""),
        ),
        static={"rules": ["timer"], "lines": [12]},
        compile={"status": "ok", "registers": 40, "spills": 0, "targets": ["sm_90"]},
        features={"vector_width": 4, "shared_bytes": 0, "warp_shuffles": True},
        correctness=({"case": "small", "seed": 0, "max_abs": 1e-7, "ok": True},
                     {"case": "headline", "seed": 1, "max_abs": 0.032, "ok": False}),
        profile={"headline": {"candidate": candidate.to_dict(), "baseline": baseline.to_dict(),
                              "ratio": PairedRatio.of(candidate, baseline).to_dict(), "floor_us": 7.1}},
        sanitizer={"memcheck": {"status": "errors", "count": 3}},
        environment={"gpu": "NVIDIA H200", "driver": "570.86", "cuda": "12.8"},
        provenance={"key_parts": verdict_key(**KEY_PARTS)[1], "host": "gpu-7"},
        timings={"compile": 2.5, "correctness": 1.25, "timing": 9.0},
        domain={"supported": ["small", "headline"], "skipped": []},
    )


def passed() -> Verdict:
    return Verdict(status=Status.PASSED, kernel={"name": "k", "fingerprint": KERNEL},
                   problem={"operator": "p", "fingerprint": PROBLEM}, cases=("small",), policy=QUICK.to_dict())


# Keys


def test_key_is_a_stable_sha256_and_keeps_its_parts():
    digest, parts = verdict_key(**KEY_PARTS)
    assert len(digest) == 64 and int(digest, 16) >= 0
    assert digest == verdict_key(**KEY_PARTS)[0]
    assert parts == {"version": 1, **KEY_PARTS, "cases": ["headline", "small"], "gate": GATE_VERSION}


@pytest.mark.parametrize(
    "part, value",
    [
        ("kernel", "d" * 64),
        ("problem", "e" * 64),
        ("cases", ["small"]),
        ("cases", ["small", "headline", "ragged"]),
        ("gpu", "NVIDIA H100 80GB HBM3"),
        ("toolchain", "nvcc 12.9 / driver 570.86"),
        ("policy", STRICT.fingerprint),
        ("against", ""),
        ("mode", "compile"),
    ],
)
def test_key_changes_with_each_part(part, value):
    assert key(**{part: value}) != key()


def test_key_ignores_the_order_of_cases():
    assert key(cases=["headline", "small"]) == key(cases=["small", "headline"])


def test_every_part_yields_a_distinct_key():
    changed = [key(kernel="x"), key(problem="x"), key(cases=["x"]), key(gpu="x"), key(toolchain="x"),
               key(policy="x"), key(against="x"), key(mode="x")]
    assert len(set(changed) | {key()}) == len(changed) + 1


# The store


def test_store_round_trips_a_realistic_verdict(tmp_path):
    store = VerdictStore(tmp_path)
    verdict = rejected()
    digest = key()
    path = store.put(digest, verdict)
    assert path == tmp_path / "verdicts" / digest[:2] / f"{digest}.json.gz"
    assert path.is_file()
    again = store.get(digest)
    assert again == verdict
    assert again.reason is Reason.STATIC_CHECK
    assert [f.reason for f in again.findings] == [Reason.STATIC_CHECK, Reason.MEMCHECK, Reason.INCORRECT]
    assert again.findings[2].evidence == {"max_abs": 0.032, "index": [17, 4001], "seed": 1}
    assert TimingStats.from_dict(again.profile["headline"]["candidate"]).median_us == pytest.approx(10.3)
    assert again.profile["headline"]["ratio"]["overall"] == pytest.approx(20.5 / 10.3)  # medians of trial medians
    on_disk = json.loads(gzip.decompress(path.read_bytes()))
    assert on_disk["version"] == VERDICT_VERSION
    assert on_disk["status"] == "rejected" and on_disk["reason"] == "static_check"


def test_store_get_of_an_unknown_key_is_none(tmp_path):
    assert VerdictStore(tmp_path).get(key()) is None


def test_store_overwrites_and_lists_keys(tmp_path):
    store = VerdictStore(tmp_path)
    store.put(key(), rejected())
    store.put(key(), passed())
    store.put(key(gpu="other"), passed())
    assert store.get(key()) == passed()
    assert store.keys() == sorted([key(), key(gpu="other")])


def test_atomic_write_leaves_no_temporary_file(tmp_path):
    store = VerdictStore(tmp_path)
    for gpu in ("a", "b", "c"):
        store.put(key(gpu=gpu), rejected())
    files = sorted(p.name for p in (tmp_path / "verdicts").rglob("*") if p.is_file())
    assert files == sorted(f"{key(gpu=g)}.json.gz" for g in ("a", "b", "c"))
    assert not list(tmp_path.rglob("*.tmp"))


def test_put_replaces_a_file_that_a_reader_holds_open(tmp_path):
    # Rename, not rewrite: a reader that opened the old verdict keeps reading a whole document.
    store = VerdictStore(tmp_path)
    path = store.put(key(), rejected())
    with gzip.open(path, "rt", encoding="utf-8") as old:
        store.put(key(), passed())
        assert json.loads(old.read())["status"] == "rejected"
    assert store.get(key()).status is Status.PASSED


@pytest.mark.parametrize(
    "content",
    [
        '{"version": 1, "status": "passed", "kernel"',  # cut short
        "",
        "not json at all",
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gz"])
def test_corrupt_file_names_the_path(tmp_path, content, packed):
    path = _stored_raw(tmp_path, content.encode("utf-8"), packed)
    store = VerdictStore(tmp_path)
    with pytest.raises(DocumentError) as info:
        store.get(key())
    assert info.value.where == str(path)
    assert str(info.value).startswith(f"{path}: corrupt verdict: ")


@pytest.mark.parametrize(
    "content, fragment",
    [
        (b"\xff\xfe\x00garbage", "corrupt verdict"),
        (b"[1, 2]", "verdict: must be an object"),
        (b'{"version": 1, "status": "passed"}', "missing 'kernel'"),
        (b'{"version": 7, "status": "passed"}', "unsupported version 7"),
        (b'{"version": 1, "status": "passed", "kernel": "x", "problem": {}, "cases": [], "policy": {}}',
         "corrupt verdict"),
    ],
)
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gz"])
def test_valid_json_that_is_not_a_verdict_names_the_path(tmp_path, content, fragment, packed):
    path = _stored_raw(tmp_path, content, packed)
    store = VerdictStore(tmp_path)
    with pytest.raises(DocumentError) as info:
        store.get(key())
    assert info.value.where == str(path)
    assert fragment in str(info.value)


def _stored_raw(root, content: bytes, packed: bool):
    """`content` as the file of key() in the store at `root`: gzip-compressed in a .json.gz, or a plain .json."""
    store = VerdictStore(root)
    path = store.path(key()) if packed else store.path(key(), PLAIN)
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip_packed(content) if packed else content)
    return path


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[: len(raw) // 2],  # cut short
        lambda raw: b"not gzip" + raw,  # bad header
        lambda raw: raw[:20] + bytes(b ^ 0xFF for b in raw[20:40]) + raw[40:],  # bad data
        lambda raw: raw[:-8] + bytes(8),  # bad checksum and length
    ],
    ids=["cut short", "bad header", "bad data", "bad checksum"],
)
def test_a_corrupt_gzip_file_names_the_path(tmp_path, damage):
    store = VerdictStore(tmp_path)
    path = store.put(key(), rejected())
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DocumentError) as info:
        store.get(key())
    assert info.value.where == str(path)
    assert str(info.value).startswith(f"{path}: corrupt verdict: ")


def test_put_writes_the_same_bytes_for_the_same_verdict(tmp_path):
    first = VerdictStore(tmp_path / "a").put(key(), rejected()).read_bytes()
    second = VerdictStore(tmp_path / "b").put(key(), rejected()).read_bytes()
    assert first == second
    # Equal within a second is not enough: the gzip header holds no time and no file name.
    assert first[4:8] == bytes(4) and not first[3] & 0x08
    text = gzip.decompress(first).decode("utf-8")
    assert text == json.dumps(rejected().to_dict(), indent=1, sort_keys=True) + "\n"


def test_get_reads_a_plain_verdict_file_too(tmp_path):
    store = VerdictStore(tmp_path)
    store.put(key(), rejected())
    plain = store.path(key(gpu="other"), PLAIN)
    plain.parent.mkdir(parents=True, exist_ok=True)
    plain.write_text(json.dumps(passed().to_dict()), encoding="utf-8")
    assert store.get(key()) == rejected()
    assert store.get(key(gpu="other")) == passed()


def test_a_key_stored_in_both_spellings_lists_once_and_serves_the_gz(tmp_path):
    store = VerdictStore(tmp_path)
    packed = store.put(key(), rejected())
    plain = store.path(key(), PLAIN)
    plain.write_text(json.dumps(passed().to_dict()), encoding="utf-8")
    assert store.files() == [plain, packed]
    assert store.keys() == [key()]
    assert store.get(key()) == rejected()


def test_put_replaces_a_plain_file_of_the_key(tmp_path):
    store = VerdictStore(tmp_path)
    plain = store.path(key(), PLAIN)
    plain.parent.mkdir(parents=True)
    plain.write_text(json.dumps(rejected().to_dict()), encoding="utf-8")
    store.put(key(), passed())
    assert not plain.exists() and store.files() == [store.path(key())]
    assert store.get(key()) == passed()


# The two-level cache


def test_lookup_prefers_local_then_recorded_and_says_which(tmp_path):
    cache = GateCache(local=tmp_path / "local", recorded=tmp_path / "recorded")
    assert cache.lookup(key()) is None

    VerdictStore(tmp_path / "recorded").put(key(), rejected())
    assert cache.lookup(key()) == (rejected(), "recorded")

    VerdictStore(tmp_path / "local").put(key(), passed())
    assert cache.lookup(key()) == (passed(), "cache")


def test_lookup_with_only_one_store(tmp_path):
    VerdictStore(tmp_path / "r").put(key(), passed())
    assert GateCache(local=None, recorded=tmp_path / "r").lookup(key()) == (passed(), "recorded")
    assert GateCache(local=tmp_path / "r", recorded=None).lookup(key()) == (passed(), "cache")
    assert GateCache(local=None, recorded=None).lookup(key()) is None


def test_store_writes_local_and_records_on_request(tmp_path):
    cache = GateCache(local=tmp_path / "local", recorded=tmp_path / "recorded")
    cache.store(key(), passed())
    assert VerdictStore(tmp_path / "local").get(key()) == passed()
    assert VerdictStore(tmp_path / "recorded").get(key()) is None
    cache.store(key(gpu="x"), rejected(), record=True)
    assert VerdictStore(tmp_path / "recorded").get(key(gpu="x")) == rejected()
    assert VerdictStore(tmp_path / "local").get(key(gpu="x")) == rejected()


def test_replay_hit_returns_the_recording(tmp_path):
    VerdictStore(tmp_path / "recorded").put(key(), rejected())
    cache = GateCache(local=None, recorded=tmp_path / "recorded")
    digest, parts = verdict_key(**KEY_PARTS)
    assert cache.replay(digest, parts) == (rejected(), "recorded")


def test_replay_miss_names_kernel_problem_and_gpu(tmp_path):
    cache = GateCache(local=tmp_path / "local", recorded=tmp_path / "recorded")
    VerdictStore(tmp_path / "recorded").put(key(), rejected())
    digest, parts = verdict_key(**{**KEY_PARTS, "gpu": "NVIDIA H100 80GB HBM3"})
    with pytest.raises(ReplayMiss) as info:
        cache.replay(digest, parts)
    message = str(info.value)
    assert isinstance(info.value, KLineageError)
    assert message.startswith(f"no recorded verdict for kernel {KERNEL[:12]} on problem {PROBLEM[:12]} ")
    assert "(cases headline, small, GPU NVIDIA H100 80GB HBM3, nvcc 12.8 / driver 570.86, " in message
    assert f"policy {POLICY[:12]})" in message
    assert "replay never guesses" in message


# Verdict documents


def test_verdict_round_trips_through_json():
    verdict = rejected()
    assert Verdict.from_dict(json.loads(json.dumps(verdict.to_dict()))) == verdict
    assert Verdict.from_dict(passed().to_dict()) == passed()


def test_rejected_needs_findings():
    with pytest.raises(DocumentError, match="^verdict: a rejected verdict needs at least one finding$"):
        Verdict(status=Status.REJECTED, kernel={}, problem={}, cases=(), policy={})


@pytest.mark.parametrize("status", [Status.PASSED, Status.COMPILED])
def test_passed_and_compiled_cannot_carry_findings(status):
    with pytest.raises(DocumentError, match=f"^verdict: a {status.value} verdict cannot carry findings$"):
        Verdict(status=status, kernel={}, problem={}, cases=(), policy={},
                findings=(Finding(Reason.RACE, "sanitize", "hazard"),))


def test_error_verdicts_may_carry_findings_or_none():
    assert Verdict(status=Status.ERROR, kernel={}, problem={}, cases=(), policy={}).reason is None
    verdict = Verdict(status=Status.ERROR, kernel={}, problem={}, cases=(), policy={},
                      findings=(Finding(Reason.UNKNOWN, "run", "harness died"),))
    assert verdict.reason is Reason.UNKNOWN and not verdict.passed


def test_findings_are_sorted_by_reason_priority():
    reasons = [Reason.UNKNOWN, Reason.INCORRECT, Reason.TIMEOUT, Reason.COMPILE_ERROR, Reason.NAN_OUTPUT, Reason.CRASH]
    verdict = Verdict(status=Status.REJECTED, kernel={}, problem={}, cases=(), policy={},
                      findings=tuple(Finding(r, "s", r.value) for r in reasons))
    assert [f.reason for f in verdict.findings] == [Reason.COMPILE_ERROR, Reason.TIMEOUT, Reason.CRASH,
                                                     Reason.NAN_OUTPUT, Reason.INCORRECT, Reason.UNKNOWN]
    assert verdict.reason is Reason.COMPILE_ERROR
    assert verdict.to_dict()["reason"] == "compile_error"


def test_sorting_is_stable_for_equal_reasons():
    findings = (Finding(Reason.INCORRECT, "c", "case b", "b"), Finding(Reason.RACE, "s", "race"),
                Finding(Reason.INCORRECT, "c", "case a", "a"))
    verdict = Verdict(status=Status.REJECTED, kernel={}, problem={}, cases=(), policy={}, findings=findings)
    assert [f.message for f in verdict.findings] == ["race", "case b", "case a"]


def test_reason_priority_is_declaration_order():
    assert Reason.STATIC_CHECK.priority == 0
    assert Reason.UNKNOWN.priority == len(Reason) - 1
    assert Reason.OUT_OF_BOUNDS_WRITE.priority < Reason.INCORRECT.priority


@pytest.mark.parametrize(
    "change, message",
    [
        ({"status": "maybe"}, "verdict: unknown status 'maybe'"),
        ({"status": None}, "verdict: unknown status None"),
        ({"version": 2}, "verdict: unsupported version 2"),
        ({"version": None}, "verdict: unsupported version None"),
        ({"findings": [{"reason": "slow", "stage": "x", "message": "m"}]}, "finding: unknown reason 'slow'"),
    ],
)
def test_unknown_status_version_or_reason_refused(change, message):
    data = rejected().to_dict()
    data.update(change)
    with pytest.raises(DocumentError) as info:
        Verdict.from_dict(data)
    assert str(info.value) == message


@pytest.mark.parametrize("key_name", ["kernel", "problem", "cases", "policy"])
def test_verdict_missing_key(key_name):
    data = passed().to_dict()
    del data[key_name]
    with pytest.raises(DocumentError, match=f"^verdict: missing '{key_name}'$"):
        Verdict.from_dict(data)


def test_verdict_optional_sections_default_to_empty():
    data = {"version": 1, "status": "compiled", "kernel": {"name": "k"}, "problem": {}, "cases": ["a"], "policy": {}}
    verdict = Verdict.from_dict(data)
    assert verdict.status is Status.COMPILED and not verdict.passed
    assert (verdict.findings, verdict.profile, verdict.timings, verdict.domain) == ((), {}, {}, {})


# Policy


def test_policy_round_trip():
    for policy in (GatePolicy(), QUICK, STRICT, GatePolicy(seeds=16, trials=10, min_reps=1, max_reps=1,
                                                           input_sets=8, require_ratio=1.2, timing_case="small"),
                   GatePolicy(placement=Placement.EXCHANGED)):
        data = json.loads(json.dumps(policy.to_dict()))
        assert GatePolicy.from_dict(data) == policy
        assert GatePolicy.from_dict(data).fingerprint == policy.fingerprint
    assert STRICT.to_dict()["sanitize"] == "always"
    assert GatePolicy.from_dict({}) == GatePolicy()
    assert GatePolicy.from_dict({"sanitize": "never"}).sanitize is Sanitize.NEVER


def test_policy_fingerprint_changes_with_every_field():
    base = GatePolicy()
    changes = {"seeds": 4, "timing": False, "timing_case": "x", "vendor": False, "warmup": 6, "trials": 4,
               "min_reps": 16, "max_reps": 201, "trial_seconds": 2.0, "spread_target": 0.1, "input_sets": 2,
               "sanitize": Sanitize.ALWAYS, "launch_timeout_s": 5.0, "run_timeout_s": 60.0, "output_cap": 1024,
               "require_ratio": 1.1, "placement": Placement.EXCHANGED, "timing_scope": TimingScope.EVERY_CASE}
    assert set(changes) == set(GatePolicy.__dataclass_fields__)
    prints = {base.fingerprint} | {base.with_(**{k: v}).fingerprint for k, v in changes.items()}
    assert len(prints) == len(changes) + 1


def test_kernels_timed_as_loaded_keep_the_fingerprint_of_policies_from_before_placement():
    """Every recorded verdict was judged before `placement` existed, each kernel where it landed."""
    assert "placement" not in GatePolicy().to_dict()
    assert GatePolicy(placement=Placement.EXCHANGED).to_dict()["placement"] == "exchanged"
    # the default policy's fingerprint as it was before the field (commit e4822f5)
    assert GatePolicy(placement=Placement.AS_LOADED).fingerprint == (
        "d4642497efcbca045e3f78dccff534c9cbcd48f0e6d6afe6718458f911ecb222")


def test_policy_with_returns_a_changed_copy():
    changed = QUICK.with_(seeds=5)
    assert (changed.seeds, QUICK.seeds, changed.timing) == (5, 3, False)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"seeds": 0}, "policy: seeds must be between 1 and 16"),
        ({"seeds": 17}, "policy: seeds must be between 1 and 16"),
        ({"trials": 0}, "policy: need 1..10 trials and 1 <= min_reps <= max_reps"),
        ({"trials": 11}, "policy: need 1..10 trials"),
        ({"min_reps": 0}, "policy: need 1..10 trials and 1 <= min_reps <= max_reps"),
        ({"min_reps": 50, "max_reps": 20}, "policy: need 1..10 trials and 1 <= min_reps <= max_reps"),
        ({"input_sets": 0}, "policy: input_sets must be between 1 and 8"),
        ({"input_sets": 9}, "policy: input_sets must be between 1 and 8"),
    ],
)
def test_policy_validation(values, message):
    with pytest.raises(DocumentError) as info:
        GatePolicy(**values)
    assert str(info.value).startswith(message)
    with pytest.raises(DocumentError):
        GatePolicy.from_dict(values)


def test_policy_from_dict_refusals():
    with pytest.raises(DocumentError, match=r"^policy: unknown keys \['retries', 'seed'\]$"):
        GatePolicy.from_dict({"seed": 3, "retries": 1})
    with pytest.raises(
        DocumentError, match="^policy: sanitize must be one of never, on_pass, always, not 'sometimes'$"
    ):
        GatePolicy.from_dict({"sanitize": "sometimes"})
    with pytest.raises(DocumentError, match="^policy: placement must be one of as_loaded, exchanged, not 'best'$"):
        GatePolicy.from_dict({"placement": "best"})
    with pytest.raises(DocumentError, match="^policy: "):
        GatePolicy.from_dict({"seeds": "3"})
    with pytest.raises(DocumentError, match="^policy: must be a table$"):
        GatePolicy.from_dict(["seeds", 3])
