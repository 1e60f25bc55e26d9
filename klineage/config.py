"""Engine settings, read from the environment in one place, each with a safe default."""

from __future__ import annotations

import os
from enum import Enum
from pathlib import Path

from klineage.errors import KLineageError

REPO_ROOT = Path(__file__).resolve().parent.parent


class GateMode(str, Enum):
    GPU = "gpu"  # compile here, run on this machine's GPU
    REPLAY = "replay"  # serve recorded verdicts only; a miss is an error
    COMPILE_ONLY = "compile"  # static check, compile and features; nothing runs


def _path(name: str, default: Path) -> Path:
    value = os.environ.get(name, "").strip()
    return Path(value).expanduser() if value else default


def data_dir() -> Path:
    return _path("KLINEAGE_DATA_DIR", REPO_ROOT / "var")


def cache_dir() -> Path:
    """Compile and verdict caches of this machine (content-addressed, safe to delete)."""
    return _path("KLINEAGE_CACHE_DIR", data_dir() / "cache")


def recorded_dir() -> Path:
    """Committed verdicts measured on GPU hosts, which replay mode serves."""
    return _path("KLINEAGE_RECORDED_DIR", REPO_ROOT / "recorded")


def corpus_dir() -> Path:
    return _path("KLINEAGE_CORPUS_DIR", REPO_ROOT / "corpus")


def bench_walks_dir() -> Path:
    """Walks kept beside the corpus, gzip-compressed: dry walks for the next GPU walks' prefetch and
    the GPU walks made from them, which the library is not built from yet (bench/walks/README.md)."""
    return _path("KLINEAGE_BENCH_WALKS_DIR", REPO_ROOT / "bench" / "walks")


def bench_library_files() -> list[Path]:
    """Skill libraries built beside the corpus that the dashboard shows with it: the per-case library
    (cards with preconditions) and the transfer library, where this checkout has them;
    KLINEAGE_BENCH_LIBRARIES lists others instead, separated by the path separator."""
    value = os.environ.get("KLINEAGE_BENCH_LIBRARIES", "").strip()
    if value:
        return [Path(part).expanduser() for part in value.split(os.pathsep) if part.strip()]
    results = REPO_ROOT / "bench" / "results"
    # A default a checkout lacks is no error; a file the variable names must be there.
    return [path for path in (results / "percase" / "library.json", results / "transfer-library.json")
            if path.is_file()]


def gate_mode(default: GateMode | None = None) -> GateMode:
    value = os.environ.get("KLINEAGE_GATE", "").strip().lower()
    if not value:
        return default or GateMode.GPU
    try:
        return GateMode(value)
    except ValueError:
        raise KLineageError(f"KLINEAGE_GATE must be one of {[m.value for m in GateMode]}, not {value!r}") from None


def replay_gpu() -> str:
    """The GPU whose recorded verdicts replay mode serves."""
    return os.environ.get("KLINEAGE_REPLAY_GPU", "NVIDIA H200").strip()


def runner_python() -> str:
    """The interpreter for the sandboxed GPU runner (it needs torch with CUDA and pycuda)."""
    import sys

    return os.environ.get("KLINEAGE_RUNNER_PYTHON", "").strip() or sys.executable


def sanitizer_path() -> str | None:
    """compute-sanitizer, if this machine has it."""
    import shutil

    explicit = os.environ.get("KLINEAGE_COMPUTE_SANITIZER", "").strip()
    if explicit:
        return explicit
    for candidate in ("compute-sanitizer", "/usr/local/cuda/bin/compute-sanitizer",
                      "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
        found = shutil.which(candidate)
        if found:
            return found
    return None


UNSAFE_NO_SANDBOX = "KLINEAGE_UNSAFE_NO_SANDBOX"


def bwrap_path() -> str | None:
    """bubblewrap, which every process that runs untrusted code starts inside: KLINEAGE_BWRAP (used
    as given, so a wrong path is refused rather than silently replaced), else `bwrap` on PATH."""
    import shutil

    return os.environ.get("KLINEAGE_BWRAP", "").strip() or shutil.which("bwrap")


def sandbox_disabled() -> bool:
    """KLINEAGE_UNSAFE_NO_SANDBOX=1: run untrusted code without bubblewrap. For a developer's own
    machine only; the engine logs a warning on every sandboxed start and the dashboard shows a banner."""
    value = os.environ.get(UNSAFE_NO_SANDBOX, "").strip()
    if value not in ("", "0", "1"):
        raise KLineageError(f"{UNSAFE_NO_SANDBOX} must be 1 (run untrusted code unsandboxed) or 0, not {value!r}")
    return value == "1"


def warm_runners() -> bool:
    """KLINEAGE_WARM_RUNNER=0: walks and optimizations gate every kernel in a fresh runner, as
    before warm runners (klineage.gate.warm); 1, the default, keeps one runner per run and problem."""
    value = os.environ.get("KLINEAGE_WARM_RUNNER", "1").strip()
    if value not in ("0", "1"):
        raise KLineageError(f"KLINEAGE_WARM_RUNNER must be 1 (keep a warm runner) or 0, not {value!r}")
    return value == "1"


def sandbox_memory_bytes() -> int:
    """The memory one sandboxed job may use (a cgroup limit where one can be made); default half the RAM."""
    default_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 // (1 << 20)
    return int(_number("KLINEAGE_SANDBOX_MEMORY_MB", default_mb, int) or default_mb) << 20


def sandbox_pids() -> int:
    """Processes and threads one sandboxed job may run (torch's pools count: a GPU runner uses ~100)."""
    return int(_number("KLINEAGE_SANDBOX_PIDS", 1024, int) or 1024)


def compile_timeout_s() -> float:
    """How long nvcc may run on one kernel. Running past it judges nothing (the limit depends on the
    machine and its load: six gates compiling side by side take several times longer)."""
    return _number("KLINEAGE_COMPILE_TIMEOUT_S", 300.0) or 300.0


# LLM rewriter settings. The API key is read here and handed to the client only: it is never
# logged, never put in a document, and never part of a repr.

LLM_DEFAULT_BUDGET_USD = 10.0  # the paper's model budget per workload
LLM_DEFAULT_BUDGET_TOKENS = 2_000_000  # binds when the price is unknown (and always, as a backstop)


def _number(name: str, default: float, kind: type = float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        number = kind(value)
    except ValueError:
        raise KLineageError(f"{name} must be a {'whole ' if kind is int else ''}number, not {value!r}") from None
    if number < 0 or number != number or number in (float("inf"), float("-inf")):
        raise KLineageError(f"{name} must be a finite number >= 0, not {value!r}")
    return number


def llm_base_url() -> str | None:
    """An OpenAI-compatible endpoint (`http://host:port/v1`); unset means OpenAI's own."""
    return os.environ.get("KLINEAGE_LLM_BASE_URL", "").strip() or None


def llm_model() -> str | None:
    return os.environ.get("KLINEAGE_LLM_MODEL", "").strip() or None


def llm_api_key() -> str | None:
    return os.environ.get("OPENAI_API_KEY", "").strip() or None


def llm_max_retries() -> int:
    """Retries after a malformed answer, and the client's retries after a failed request."""
    return int(_number("KLINEAGE_LLM_MAX_RETRIES", 2, int))


def llm_timeout_s() -> float:
    return _number("KLINEAGE_LLM_TIMEOUT_S", 300.0) or 300.0


def llm_budget_usd() -> float:
    return _number("KLINEAGE_LLM_BUDGET_USD", LLM_DEFAULT_BUDGET_USD)


def llm_budget_tokens() -> int:
    return int(_number("KLINEAGE_LLM_BUDGET_TOKENS", LLM_DEFAULT_BUDGET_TOKENS, int))


def llm_price_in() -> float:
    """USD per million prompt tokens; 0 means unknown (cost is then reported as unknown)."""
    return _number("KLINEAGE_LLM_PRICE_IN", 0.0)


def llm_price_out() -> float:
    """USD per million completion tokens; 0 means unknown."""
    return _number("KLINEAGE_LLM_PRICE_OUT", 0.0)
