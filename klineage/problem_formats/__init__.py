"""Problem formats: which kind a problem file is, the files that define it, and loading it into the contract.

Every format loads into the same `klineage.problem.Problem` (named inputs and outputs, cases whose
parameters a launch plan can use, a reference, a vendor path where the format has one):

- `klineage`: this project's Python files (`CASES`, `make_inputs(case, seed, device)`, `reference`, ...),
  and the reference implementation's first files (`make_inputs(seed, device)`, `torch_ref(*inputs)`);
- `keyword`: the reference implementation's keyword files (`make_inputs(*, seed=0, device="cuda", **sizes)`
  returning a dict, `torch_ref(**tensors, **params)`), see `keyword.py`;
- `kernelbench`: KernelBench files (`class Model`, `get_inputs`, `get_init_inputs`), see `kernelbench.py`;
- `flashinfer`: FlashInfer trace definitions (JSON) with their workloads (JSONL), see `flashinfer.py`.

`detect`, `source_files` and `fingerprint` only read files (Python is parsed, never run), so the parent
process and the web may call them; `load_problem` runs problem code and belongs in the sandboxed runner.
"""

from __future__ import annotations

import ast
import functools
from enum import Enum
from pathlib import Path

from klineage.errors import DocumentError
from klineage.fingerprint import normalize_source, sha256_text
from klineage.problem import contract_source


class ProblemFormat(str, Enum):
    KLINEAGE = "klineage"
    KEYWORD = "keyword"
    KERNELBENCH = "kernelbench"
    FLASHINFER = "flashinfer"


def _read_text(path: Path) -> str:
    if not path.is_file():
        raise DocumentError(str(path), "problem file not found")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DocumentError(str(path), "problem file is not UTF-8") from None


def detect(path: str | Path) -> ProblemFormat:
    """The format of a problem file, from its suffix and (for Python) its parsed top-level names."""
    path = Path(path)
    text = _read_text(path)
    if path.suffix == ".json":
        return ProblemFormat.FLASHINFER
    if path.suffix != ".py":
        raise DocumentError(str(path), "a problem is a Python file (.py) or a FlashInfer trace definition (.json)")
    try:
        return _python_format(text)
    except SyntaxError as exc:
        raise DocumentError(str(path), f"not valid Python: {exc.msg} (line {exc.lineno})") from None
    except (RecursionError, MemoryError):  # the parser gives up on hostile nesting before it finds an error
        raise DocumentError(str(path), "not readable: nested too deeply for Python's parser") from None


@functools.lru_cache(maxsize=64)  # every gate lookup asks again of the same few files
def _python_format(text: str) -> ProblemFormat:
    tree = ast.parse(text)
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    if "Model" in classes and "get_inputs" in functions:
        return ProblemFormat.KERNELBENCH
    make_inputs = functions.get("make_inputs")
    if "torch_ref" in functions and make_inputs is not None:
        args = make_inputs.args
        if not args.posonlyargs and not args.args:  # only keywords: the reference's keyword/dict files
            return ProblemFormat.KEYWORD
    return ProblemFormat.KLINEAGE


def source_files(path: str | Path) -> list[Path]:
    """Every file whose content defines the problem (the file itself, and a trace's workloads and tensors)."""
    path = Path(path)
    if detect(path) is ProblemFormat.FLASHINFER:
        from klineage.problem_formats.flashinfer import trace_files

        return trace_files(path)
    return [path]


def fingerprint(path: str | Path) -> str:
    """The problem's content fingerprint. A one-file problem keeps the fingerprint of its normalized
    source (recorded verdicts are keyed by it); a trace hashes its definition, workloads and tensors."""
    path = Path(path)
    if detect(path) is ProblemFormat.FLASHINFER:
        from klineage.problem_formats.flashinfer import trace_fingerprint

        return trace_fingerprint(path)
    return python_fingerprint(_read_text(path))


def python_fingerprint(text: str) -> str:
    """The fingerprint of a one-file (Python) problem from its text: its timing-only SWEEP literal is
    not part of the contract."""
    return sha256_text(normalize_source(contract_source(text)))


def load_problem(path: str | Path):
    """Load a problem of any format into the contract. Runs its code: call only inside the runner."""
    kind = detect(path)
    if kind is ProblemFormat.KEYWORD:
        from klineage.problem_formats.keyword import load
    elif kind is ProblemFormat.KERNELBENCH:
        from klineage.problem_formats.kernelbench import load
    elif kind is ProblemFormat.FLASHINFER:
        from klineage.problem_formats.flashinfer import load
    else:
        from klineage.problem import load_problem as load
    return load(Path(path))
