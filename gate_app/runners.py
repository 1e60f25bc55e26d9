"""The child's side of each kind of job (gate_app.kinds names them): the engine work, given the job's
payload and the channel to the worker; each returns the job's result. Run in `python -m gate_app.child`:
the engine only, never Django.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gate_app.child import Channel


def run_gate_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Judge a kernel (bundled or uploaded) on a problem; the result is the verdict document."""
    from klineage import uploads
    from klineage.config import GateMode
    from klineage.gate.pipeline import run_gate
    from klineage.gate.policy import GatePolicy

    problem = uploads.problem_path(payload["problem"])
    kernel = uploads.kernel_entry(payload["kernel"]).load()
    against = uploads.kernel_entry(payload["against"]).load() if payload.get("against") else None
    policy = GatePolicy.from_dict(payload.get("policy") or {})
    verdict = run_gate(problem, kernel, against=against, cases=payload.get("cases") or None, policy=policy,
                       mode=GateMode(payload.get("mode", "gpu")), progress=channel.progress,
                       record=bool(payload.get("record", False)))
    return verdict.to_dict()


_ACCEPTED = re.compile(r"step (\d+): accepted ")  # the walker's progress line for an accepted step


def _rewriter(name: str) -> Any:
    """None is the rule rewriter over the catalog; "llm" reads its settings from the environment."""
    if name != "llm":
        return None
    from klineage.rewriters.llm import LLMRewriter

    return LLMRewriter()


def run_walk_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Walk an expert (bundled or uploaded) backward; the result is the lineage document."""
    from klineage import uploads
    from klineage.config import GateMode
    from klineage.walk.walker import walk

    expert = uploads.kernel_entry(payload["kernel"]).load()
    max_steps = int(payload["max_steps"])

    def progress(stage: str, message: str) -> None:
        accepted = _ACCEPTED.match(message)
        channel.progress(stage, message, min(0.95, (int(accepted.group(1)) + 1) / max_steps) if accepted else None)

    lineage = walk(uploads.problem_path(payload["problem"]), expert, _rewriter(payload.get("rewriter", "rules")),
                   gate_mode=GateMode(payload["mode"]), max_steps=max_steps,
                   max_rejections=int(payload["max_rejections"]), progress=progress)
    return lineage.to_dict()


def run_optimize_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Optimize a kernel (bundled or uploaded) with the library the worker sent; the result is the
    optimization document. Each attempt and step goes to the worker as an event as it happens."""
    from klineage import config, uploads
    from klineage.config import GateMode
    from klineage.optimize import optimize
    from klineage.skills.library import Library

    problem = uploads.problem_path(payload["problem"])
    library = None
    if payload.get("library") is not None:
        library = Library.from_dict(payload["library"])
        if payload["scope"] == "other_operators":  # held out: only what was learnt on other operators
            from klineage.gate.execute import probe_problem

            operator = probe_problem(problem, config.cache_dir()).info.operator
            library = Library(tuple(c for c in library.cards if operator not in c.scope.operators),
                              {"path": f"{library.provenance.get('path', 'library')}, without {operator}'s cards"})
    result = optimize(problem, uploads.kernel_entry(payload["kernel"]).load(), strategy=payload["strategy"],
                      library=library, budget=int(payload["budget"]), gate_mode=GateMode(payload["mode"]),
                      rewriter=payload["rewriter"], seed=int(payload["seed"]), statuses=payload["statuses"],
                      time_limit_s=payload.get("time_limit_s"), progress=channel.progress,
                      on_event=lambda event: channel.send({"event": event.to_dict()}))
    return result.to_dict()


def run_fit_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Every card's fit on the kernel (klineage.skills.retrieval.assess): the proposed ones in the order the
    optimizer would try them, then the others with why; no compile, no gate."""
    from klineage import config, uploads
    from klineage.gate.execute import probe_problem
    from klineage.skills.card import CardStatus
    from klineage.skills.library import Library, lineage_index
    from klineage.skills.retrieval import assess

    library = Library.from_dict(payload["library"])
    state = uploads.kernel_entry(payload["kernel"]).load()
    channel.progress("probe", f"probing {payload['problem']} in the sandboxed runner")
    problem = probe_problem(uploads.problem_path(payload["problem"]), config.cache_dir()).info
    channel.progress("fit", f"matching {len(library.cards)} cards against {state.name}")
    found = assess(state, problem, library.cards, statuses=tuple(CardStatus(s) for s in payload["statuses"]),
                   lineages=lineage_index(), every_case=True)
    return {"kernel": state.name, "operator": problem.operator, "headline": problem.headline,
            "cards": len(library.cards),
            "fits": [a.to_dict() for a in found]}


def run_probe_payload(payload: dict[str, Any], channel: Channel) -> dict[str, Any]:
    """Probe an uploaded problem file in the sandboxed runner: {"probe": ...}, or {"refused": why}
    when its file does not load or breaks the problem contract."""
    from klineage import config, uploads
    from klineage.errors import DocumentError
    from klineage.gate.execute import probe_problem

    path = uploads.problem_path(payload["problem"])
    channel.progress("probe", f"running {payload['problem']} in the sandboxed runner")
    try:
        return {"probe": probe_problem(path, config.cache_dir()).to_dict()}
    except DocumentError as exc:
        # The runner's own error repeats where it happened: keep its message, named as uploaded.
        message = str(exc).removeprefix(f"{exc.where}: ").removeprefix("DocumentError: ")
        return {"refused": message.replace(str(path), payload["problem"])}
