"""The LLM rewriter: asks a model, through any OpenAI-compatible endpoint, for one simplification.

`propose(state, history)` shows the model the kernel, its launch plan, the catalog's vocabulary
and the walk so far, and asks it to remove exactly ONE mechanism at ONE locus. The answer must be
one JSON object under a strict schema (`answer_schema`); it is checked here as well: the schema,
a known transform name, a source that parses, passes the static check and differs from the input,
and plan changes that make a valid plan. A malformed answer is sent back with the reason, up to
`max_retries` times; after that the proposal comes back failed, with the reason. Nothing raises
into the walk except `BudgetExhausted`: every call is checked against the budget before (on an
estimate) and after (on the reported usage).

`materialize(state, card)` uses the same machinery the other way: apply one skill card's intent,
anchor and carrier to a kernel (forward optimization).

`propose` yields `LLMProposal`, a `klineage.rewriters.base.Proposal` (a backward `Rewrite`, or the
reason there is none) that also carries the rationale, usage, attempts and malformed answers; a
failed one names the transform FAILED_TRANSFORM ("llm"). `materialize` returns a `Materialization`
(a forward `Rewrite`, or the reason). Catalog transforms lend their declared `removes`/`adds` to
the rewrite; an "other:<name>" answer declares none.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import jsonschema

from klineage import config
from klineage.errors import DocumentError, KLineageError
from klineage.features.cuda_parser import syntax_errors
from klineage.fingerprint import canonical_json
from klineage.gate.static import static_check
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.rewriters.base import Proposal
from klineage.rewriters.llm_budget import Budget, BudgetExhausted, Ledger, Prices, Usage, estimate_tokens
from klineage.transforms.base import Anchor, Direction, Rewrite

try:
    import openai
except ImportError:  # the "llm" extra is not installed; an injected client still works
    openai = None

log = logging.getLogger(__name__)

SCHEMA_NAME = "kernel_edit"
OTHER_NAME = re.compile(r"^other:[a-z][a-z0-9_]{0,62}$")
EVIDENCE_CHARS = 400  # per history entry in the prompt
ANSWER_OVERHEAD_TOKENS = 512  # rationale, anchor and JSON around the edited source
_FENCE = re.compile(r"^\s*```(?:json)?\s*\n(.*)\n\s*```\s*$", re.DOTALL)

_RULES = """\
Rules:
- Prefer a transform from the catalog; name a mechanism outside it "other:<snake_case_name>".
- When a mechanism depends on another, remove the dependent one first (a catalog entry's "remove after" \
names what must be gone before it).
- Changing only a tile size, vector width or stage count is carrier tuning, not a step.
- Keep every __global__ entry's name and parameter list: the launch arguments cannot change. Grid, block \
and dynamic shared memory can (plan_changes).
- One self-contained file: CUDA headers only; no libraries (cuBLAS, CUTLASS/CuTe, Thrust, CUB device-wide, \
torch); no host runtime calls, mutable __device__ state or clocks.
- The anchor names the locus: function (the enclosing function, or "<file>"), kind ("loop", "declaration", \
"call", "asm", "function", "pragma", "plan" ...) and a stable key (a variable or helper name, "loop:k#0" \
for the first loop over k), never a line number.
- Answer with one JSON object matching the schema; `source` is the complete edited kernel.cu, not a diff."""

BACKWARD_SYSTEM = f"""\
You simplify expert CUDA kernels one gated step at a time, walking them backward toward a naive kernel. \
Each step removes exactly ONE optimization mechanism at ONE locus and changes nothing else. The result must \
stay correct: the same outputs for every case the launch plan supports, not only typical ones (odd sizes, \
tails, misaligned or small inputs). A gate compiles, tests and times every step; rejected steps are evidence.
{_RULES}
- Do not repeat a rejected step at the same anchor unless your edit answers its reason."""

FORWARD_SYSTEM = f"""\
You apply one verified optimization skill to a CUDA kernel: add exactly the ONE mechanism the skill \
describes, at the locus its anchor names (or the matching locus of this kernel), with its carrier choices, \
and change nothing else. Respect its preconditions and risks. The result must stay correct for every case \
the launch plan supports; a gate compiles, tests and times it.
{_RULES}"""


class _Malformed(Exception):
    """An answer that cannot be used; the message goes back to the model."""


FAILED_TRANSFORM = "llm"  # the transform a proposal names when no answer was usable


@dataclass(frozen=True, kw_only=True)
class _LLMDetails:
    """What the model said and what it cost, beside the rewrite (or the reason there is none)."""

    rationale: str = ""
    usage: Usage = Usage()  # every call made for this answer, retries included
    failure: str = ""  # "" when usable; "malformed" (no answer passed the checks) or "endpoint"
    attempts: int = 0  # answers received
    malformed: int = 0  # of them, answers that failed the checks
    errors: tuple[str, ...] = ()  # what was wrong with each malformed answer, in order
    plan_changed: bool = False
    model: str = ""

    @property
    def failed(self) -> bool:
        return bool(self.failure)

    @property
    def state(self) -> KernelState | None:
        """The edited kernel; None when failed, so a failure cannot be gated by mistake."""
        rewrite = getattr(self, "rewrite", None)
        return rewrite.state if rewrite is not None else None

    @property
    def in_catalog(self) -> bool:
        name = getattr(self, "transform", "")
        return not self.failed and not name.startswith("other:")

    def to_dict(self) -> dict[str, Any]:
        rewrite, anchor = getattr(self, "rewrite", None), getattr(self, "anchor", None)
        return {"rewriter": LLMRewriter.name, "model": self.model, "transform": getattr(self, "transform", ""),
                "anchor": anchor.to_dict() if anchor else None, "rationale": self.rationale,
                "rewrite": rewrite.to_dict() if rewrite else None, "plan_changed": self.plan_changed,
                "failed": self.failed, "failure": self.failure, "reason": getattr(self, "reason", ""),
                "attempts": self.attempts, "malformed": self.malformed, "errors": list(self.errors),
                "usage": self.usage.to_dict()}

    def __repr__(self) -> str:
        kind = type(self).__name__
        if self.failed:
            return f"{kind}(failed={self.failure!r}, reason={getattr(self, 'reason', '')!r}, " \
                   f"usage={self.usage.describe()!r})"
        return (f"{kind}({getattr(self, 'transform', '')!r} at {str(getattr(self, 'anchor', ''))!r}, "
                f"attempts={self.attempts}, malformed={self.malformed}, usage={self.usage.describe()!r})")

    __str__ = __repr__


@dataclass(frozen=True, kw_only=True, repr=False)
class LLMProposal(Proposal, _LLMDetails):
    """A walk `Proposal` (a backward rewrite, or the reason there is none) with the model's details.
    A failed one names FAILED_TRANSFORM, no anchor, and the failure as its not-applicable reason."""

    @property
    def reason(self) -> str:
        return self.not_applicable_reason

    __repr__ = _LLMDetails.__repr__
    __str__ = Proposal.__str__  # the walk names proposals this way


@dataclass(frozen=True, kw_only=True, repr=False)
class Materialization(_LLMDetails):
    """A skill applied to a kernel: a FORWARD rewrite, or the reason there is none."""

    transform: str
    anchor: Anchor | None = None
    rewrite: Rewrite | None = None
    reason: str = ""


class _Outcome(NamedTuple):
    transform: str
    anchor: Anchor | None
    state: KernelState | None
    reason: str
    details: dict[str, Any]


def answer_schema(names: Iterable[str]) -> dict[str, Any]:
    """The strict JSON schema of an answer; `names` are the transforms it may name besides other:<name>."""
    choices = "|".join(re.escape(n) for n in sorted(set(names)))
    pattern = f"^(?:{choices + '|' if choices else ''}other:[a-z][a-z0-9_]*)$"
    text = {"type": "string"}
    expressions = {"type": ["array", "null"], "items": text,
                   "description": "1 to 3 expressions over case parameters and source constants, or null to keep"}
    launch_change = {
        "type": "object", "additionalProperties": False, "required": ["launch", "grid", "block", "shared"],
        "properties": {
            "launch": {"type": "integer", "description": "index of the launch in the plan, from 0"},
            "grid": expressions, "block": expressions,
            "shared": {"type": ["string", "null"], "description": "dynamic shared bytes (expression), or null"},
        },
    }
    return {
        "type": "object", "additionalProperties": False,
        "required": ["transform", "anchor", "rationale", "source", "plan_changes"],
        "properties": {
            "transform": {"type": "string", "pattern": pattern,
                          "description": "a catalog transform's name, or other:<snake_case_name>"},
            "anchor": {"type": "object", "additionalProperties": False, "required": ["function", "kind", "key"],
                       "properties": {"function": text, "kind": text, "key": text}},
            "rationale": {"type": "string", "description": "what changed, where, and why it stays correct"},
            "source": {"type": "string", "description": "the complete edited kernel.cu"},
            "plan_changes": {"type": ["array", "null"], "items": launch_change,
                             "description": "launches whose grid, block or shared memory change; null if none"},
        },
    }


class LLMRewriter:
    """Proposals from a model behind an OpenAI-compatible endpoint, checked and budgeted.

    Settings come from the environment unless given (`klineage.config`): KLINEAGE_LLM_BASE_URL,
    KLINEAGE_LLM_MODEL, OPENAI_API_KEY, KLINEAGE_LLM_MAX_RETRIES, KLINEAGE_LLM_TIMEOUT_S and, through
    the ledger, KLINEAGE_LLM_BUDGET_USD / _BUDGET_TOKENS / _PRICE_IN / _PRICE_OUT. Share one `ledger`
    between the rewriters that spend one workload's budget.
    """

    name = "llm"

    def __init__(self, client: Any = None, model: str | None = None, *, base_url: str | None = None,
                 api_key: str | None = None, max_retries: int | None = None, timeout_s: float | None = None,
                 ledger: Ledger | None = None, budget: Budget | None = None, prices: Prices | None = None,
                 transforms: Mapping[str, Any] | Iterable[Any] | None = None, max_output_tokens: int | None = None,
                 request_options: Mapping[str, Any] | None = None):
        self.model = model or config.llm_model()
        if not self.model:
            raise KLineageError("no model for the LLM rewriter: set KLINEAGE_LLM_MODEL or pass model=")
        self.max_retries = config.llm_max_retries() if max_retries is None else int(max_retries)
        if self.max_retries < 0:
            raise KLineageError("max_retries must be >= 0")
        key = api_key or config.llm_api_key()
        if client is None:
            client = _make_client(base_url or config.llm_base_url(), key, self.max_retries,
                                  timeout_s or config.llm_timeout_s())
        else:
            key = key or getattr(client, "api_key", None)
        self._client = client
        self._secrets = tuple(s for s in (key,) if isinstance(s, str) and len(s) >= 4)  # to redact, never to show
        self.base_url = self._scrub(str(getattr(client, "base_url", "") or base_url or ""))
        self.ledger = ledger if ledger is not None else Ledger(budget, prices)
        self._transforms = transforms if transforms is None or isinstance(transforms, Mapping) else list(transforms)
        self.max_output_tokens = max_output_tokens
        self.request_options = dict(request_options or {})
        self.calls = 0  # answers received over this rewriter's life
        self.malformed = 0  # of them, answers that failed the checks
        self.endpoint_failures = 0

    @property
    def spent(self) -> Usage:
        return self.ledger.spent

    def __repr__(self) -> str:
        return (f"LLMRewriter(model={self.model!r}, base_url={self.base_url!r}, "
                f"max_retries={self.max_retries}, calls={self.calls}, malformed={self.malformed}, "
                f"spent={self.ledger.spent.describe()!r}, budget={self.ledger.budget.describe()!r})")

    __str__ = __repr__

    # the two uses

    def propose(self, state: KernelState, history: Sequence[Any] = ()) -> Iterator[LLMProposal]:
        """One proposal per call, made when the iterator is first advanced (so it reads the history then)."""
        vocabulary = self.vocabulary()
        prompt = "\n\n".join([_catalog_section(vocabulary), _history_section(history, state), _kernel_section(state),
                              "# Task\nRemove exactly ONE mechanism at ONE locus of this kernel, keeping it correct "
                              "for every case it supports. Reply with the JSON object: transform, anchor "
                              "{function, kind, key}, rationale (what you removed, where, and why the result is "
                              "still correct), source (the full edited kernel.cu), plan_changes (null, or the "
                              "launches whose grid, block or shared memory must change)."])
        tried = {(f["transform"], f["anchor_object"]): f for f in map(_history_fields, history)
                 if f["parent"] == state.fingerprint and not f["accepted"] and f["anchor_object"] is not None}
        out = self._ask(state, BACKWARD_SYSTEM, prompt, [d["name"] for d in vocabulary], tried)
        if out.state is None:
            yield LLMProposal(FAILED_TRANSFORM, None, not_applicable_reason=out.reason, **out.details)
            return
        removes, adds = _declared(vocabulary, out.transform)
        rewrite = Rewrite(out.transform, Direction.BACKWARD, out.anchor, out.state, removes=removes, adds=adds,
                          note=out.details["rationale"])
        yield LLMProposal(out.transform, out.anchor, rewrite, **out.details)

    def materialize(self, state: KernelState, card_like: Mapping[str, Any]) -> Materialization:
        """Apply one skill (its intent, anchor, carrier/vector, preconditions) to this kernel."""
        vocabulary = self.vocabulary()
        names = [d["name"] for d in vocabulary]
        wanted = str(card_like.get("transform") or "")
        if wanted:
            names.append(wanted)
        card = json.dumps(dict(card_like), indent=2, sort_keys=True, default=str)
        task = ("# Task\nApply this skill: add its ONE mechanism at its anchor (or the matching locus of this "
                "kernel), with its carrier choices, keeping the kernel correct for every case it supports. "
                + (f"Name the transform {wanted!r}. " if wanted else "")
                + "Reply with the JSON object: transform, anchor, rationale, source (the full edited kernel.cu), "
                  "plan_changes.")
        prompt = "\n\n".join([_catalog_section(vocabulary), f"# Skill to apply\n```json\n{card}\n```",
                              _kernel_section(state), task])
        out = self._ask(state, FORWARD_SYSTEM, prompt, names, {})
        if out.state is None:
            return Materialization(transform=wanted or FAILED_TRANSFORM, reason=out.reason, **out.details)
        removes, adds = _declared(vocabulary, out.transform)
        rewrite = Rewrite(out.transform, Direction.FORWARD, out.anchor, out.state, removes=adds, adds=removes,
                          note=out.details["rationale"])
        return Materialization(transform=out.transform, anchor=out.anchor, rewrite=rewrite, **out.details)

    def vocabulary(self) -> list[dict[str, Any]]:
        """The catalog as the prompt shows it: each transform's describe()."""
        transforms = self._transforms
        if transforms is None:
            from klineage.transforms import catalog

            transforms = catalog()
        items = transforms.values() if isinstance(transforms, Mapping) else transforms
        found = [t.describe() if hasattr(t, "describe") else dict(t) for t in items]
        return sorted(found, key=lambda d: d["name"])

    # the machinery

    def _ask(self, state: KernelState, system: str, prompt: str, names: Sequence[str],
             tried: Mapping[tuple[str, Anchor], dict[str, Any]]) -> _Outcome:
        schema = answer_schema(names)
        response_format = {"type": "json_schema",
                           "json_schema": {"name": SCHEMA_NAME, "strict": True, "schema": schema}}
        messages: list[dict[str, str]] = [{"role": "system", "content": system}, {"role": "user", "content": prompt}]
        output_estimate = self.max_output_tokens or estimate_tokens(state.source) + ANSWER_OVERHEAD_TOKENS
        usage, errors = Usage(), []
        options = dict(self.request_options)
        if self.max_output_tokens:
            options["max_completion_tokens"] = self.max_output_tokens

        def outcome(failure: str = "", reason: str = "", answer: tuple = ("", None, None, "", False)) -> _Outcome:
            transform, anchor, new_state, rationale, plan_changed = answer
            details = {"rationale": rationale, "usage": usage, "failure": failure, "errors": tuple(errors),
                       "attempts": len(errors) + (0 if failure else 1), "malformed": len(errors),
                       "plan_changed": plan_changed, "model": self.model}
            return _Outcome(transform, anchor, new_state, self._scrub(reason), details)

        for _ in range(self.max_retries + 1):
            self.ledger.check_before(estimate_tokens(canonical_json([messages, response_format])), output_estimate)
            try:
                response = self._client.chat.completions.create(model=self.model, messages=messages,
                                                                 response_format=response_format, **options)
            except _API_ERRORS as exc:
                self.endpoint_failures += 1
                log.warning("LLM endpoint failed: %s", self._scrub(_describe_error(exc)))
                return outcome("endpoint", f"the endpoint failed after the client's retries: {_describe_error(exc)}")
            self.calls += 1
            content, finish = _content(response)
            call = self._usage(response, messages, content)
            usage = usage + call
            log.info("LLM call (%s): %s", self.model, call.describe())
            self.ledger.record(call)  # raises BudgetExhausted once spending passes the budget
            try:
                transform, anchor, new_state, rationale = _check_answer(content, finish, state, names, tried)
            except _Malformed as exc:
                error = self._scrub(str(exc))
                errors.append(error)
                self.malformed += 1
                log.info("LLM answer malformed (%d of at most %d): %s", len(errors), self.max_retries + 1, error)
                messages = messages + [{"role": "assistant", "content": content or ""},
                                       {"role": "user", "content": _feedback(error)}]
                continue
            return outcome(answer=(transform, anchor, new_state, rationale, new_state.plan != state.plan))
        return outcome("malformed", f"{len(errors)} answer(s) failed the checks; the last: {errors[-1]}")

    def _usage(self, response: Any, messages: list[dict[str, str]], content: str | None) -> Usage:
        reported = getattr(response, "usage", None)
        prompt = getattr(reported, "prompt_tokens", None)
        if prompt is not None:
            return self.ledger.usage(int(prompt), int(getattr(reported, "completion_tokens", 0) or 0))
        return self.ledger.usage(estimate_tokens(canonical_json(messages)), estimate_tokens(content or ""),
                                 estimated=True)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "[redacted]")
        return text


_API_ERRORS: tuple[type[BaseException], ...] = (openai.OpenAIError,) if openai is not None else ()


def _make_client(base_url: str | None, api_key: str | None, max_retries: int, timeout_s: float) -> Any:
    if openai is None:
        raise KLineageError("the LLM rewriter needs the openai package: pip install 'klineage[llm]'")
    if not api_key:
        if not base_url:
            raise KLineageError("no API key: set OPENAI_API_KEY, or KLINEAGE_LLM_BASE_URL for a local endpoint")
        api_key = "unused"  # local OpenAI-compatible servers often need none, but the client wants one
    return openai.OpenAI(api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout_s)


def _describe_error(exc: BaseException) -> str:
    status = getattr(exc, "status_code", None)
    message = " ".join(str(exc).split())[:300]
    return f"HTTP {status}: {message}" if status else f"{type(exc).__name__}: {message}"


def _content(response: Any) -> tuple[str | None, str]:
    choices = getattr(response, "choices", None) or []
    if not choices:
        return None, "no_choices"
    message = choices[0].message
    if getattr(message, "content", None) is None and getattr(message, "refusal", None):
        return None, f"refusal: {message.refusal}"
    return message.content, str(choices[0].finish_reason or "")


def _feedback(error: str) -> str:
    return (f"Your answer was rejected: {error}\nAnswer again with one JSON object matching the schema. "
            f"Start from the original kernel above and make exactly the one change asked for.")


def _check_answer(content: str | None, finish: str, state: KernelState, names: Sequence[str],
                  tried: Mapping[tuple[str, Anchor], dict[str, Any]]) -> tuple[str, Anchor, KernelState, str]:
    if content is None:
        raise _Malformed("the answer has no content" + (f" ({finish})" if finish else ""))
    if finish == "length":
        raise _Malformed("the answer was cut off at the token limit; keep the rationale short")
    fenced = _FENCE.match(content)
    try:
        data = json.loads(fenced.group(1) if fenced else content)
    except json.JSONDecodeError as exc:
        raise _Malformed(f"the answer is not valid JSON ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("transform"), str):
        name = data["transform"]
        if name not in names and not OTHER_NAME.match(name):
            known = ", ".join(sorted(set(names))) or "none yet"
            raise _Malformed(f"unknown transform {name!r}: name a catalog transform ({known}) "
                             f"or other:<snake_case_name>")
    schema_errors = sorted(jsonschema.Draft202012Validator(answer_schema(names)).iter_errors(data),
                           key=lambda e: list(e.absolute_path))
    if schema_errors:
        raise _Malformed("the answer does not match the schema: " + "; ".join(
            f"{'/'.join(str(p) for p in e.absolute_path) or '(the object)'}: {e.message[:200]}"
            for e in schema_errors[:5]))
    try:
        anchor = Anchor(data["anchor"]["function"].strip(), data["anchor"]["kind"].strip(),
                        data["anchor"]["key"].strip())
    except DocumentError:
        raise _Malformed("the anchor needs a non-empty function, kind and key") from None
    earlier = tried.get((data["transform"], anchor))
    if earlier:
        why = ": ".join(x for x in (earlier["category"], earlier["reason"]) if x) or "see the walk so far"
        raise _Malformed(f"{data['transform']} at {anchor} was already tried at this kernel and rejected ({why}); "
                         f"propose a different step")
    source = data["source"]
    if not source.strip():
        raise _Malformed("the source is empty; send the complete edited kernel.cu")
    issues = syntax_errors(source)
    if issues:
        raise _Malformed("the source does not parse: " + "; ".join(
            f"line {i.line}, column {i.column}: {i.text!r}" for i in issues[:5]))
    plan = _apply_plan_changes(state.plan, data["plan_changes"] or [])
    new_state = KernelState(source=source, plan=plan)
    if new_state.fingerprint == state.fingerprint:
        raise _Malformed("the edited kernel is identical to the input; remove exactly one mechanism")
    report = static_check(new_state)
    if not report.ok:
        raise _Malformed("the source fails the static check: " + "; ".join(
            f"[{f.rule.value}] line {f.line}: {f.message}" if f.line else f"[{f.rule.value}] {f.message}"
            for f in report.findings[:5]))
    return data["transform"], anchor, new_state, data["rationale"].strip()


def _apply_plan_changes(plan: LaunchPlan, changes: list[dict[str, Any]]) -> LaunchPlan:
    if not changes:
        return plan
    data = plan.to_dict()
    launches = data["launch"]
    for change in changes:
        index = change["launch"]
        if not 0 <= index < len(launches):
            raise _Malformed(f"plan_changes: launch {index} does not exist (the plan has {len(launches)}, from 0)")
        for key in ("grid", "block"):
            if change[key] is not None:
                launches[index][key] = [_expression(x) for x in change[key]]
        if change["shared"] is not None:
            launches[index]["shared"] = _expression(change["shared"])
    try:
        return LaunchPlan.from_dict(data, "plan_changes")
    except DocumentError as exc:
        raise _Malformed(str(exc)) from None


def _expression(text: str) -> str | int:
    text = text.strip()
    return int(text) if re.fullmatch(r"\d+", text) else text


# prompt sections


def _catalog_section(vocabulary: list[dict[str, Any]]) -> str:
    lines = ["# Transform catalog",
             "Each entry: the transform's name, its intent (the forward optimization), what its backward "
             "step removes and introduces, and what must be removed before it."]
    for d in vocabulary:
        parts = [f"intent: {d.get('intent', '')}", f"removes: {', '.join(d.get('removes', [])) or '-'}"]
        if d.get("adds"):
            parts.append(f"introduces: {', '.join(d['adds'])}")
        if d.get("after"):
            parts.append(f"remove after: {', '.join(d['after'])}")
        if d.get("role") == "carrier":
            parts.append("carrier tuning, not a skill")
        lines.append(f"- {d['name']}: " + "; ".join(parts))
    if not vocabulary:
        lines.append("(empty: name the mechanism as other:<snake_case_name>)")
    return "\n".join(lines)


def _history_section(history: Sequence[Any], state: KernelState) -> str:
    accepted, rejected = [], []
    for entry in history:
        fields = _history_fields(entry)
        line = f"{fields['transform']} at {fields['anchor']}"
        if not fields["accepted"] and fields["parent"] == state.fingerprint:
            line += " [tried at this kernel]"
        why = ": ".join(x for x in (fields["category"], fields["reason"]) if x)
        if why:
            line += f" - {why}"
        if fields["evidence"]:
            line += f" (evidence: {fields['evidence']})"
        (accepted if fields["accepted"] else rejected).append(line)
    lines = ["# Walk so far", "Accepted steps (already applied to the kernel below, oldest first):"]
    lines += [f"{i}. {line}" for i, line in enumerate(accepted, 1)] or ["(none)"]
    lines.append("Rejected steps (refused by the gate or not applicable; the kernel below does not contain them):")
    lines += [f"{i}. {line}" for i, line in enumerate(rejected, 1)] or ["(none)"]
    return "\n".join(lines)


def _history_fields(entry: Any) -> dict[str, Any]:
    """The fields of a walk `Attempt` (or any object or mapping with the same names; `status` or
    `outcome` of "accepted" stands in for `accepted`)."""

    def get(key: str) -> Any:
        return entry.get(key) if isinstance(entry, Mapping) else getattr(entry, key, None)

    accepted = get("accepted")
    if accepted is None:
        status = get("outcome") or get("status") or ""
        accepted = str(status.value if isinstance(status, Enum) else status).lower() == "accepted"
    anchor = get("anchor")
    if isinstance(anchor, Mapping):
        anchor = Anchor.from_dict(dict(anchor))
    evidence = get("evidence") or ""
    if not isinstance(evidence, str):
        evidence = json.dumps(evidence, sort_keys=True, default=str)
    evidence = " ".join(evidence.split())
    if len(evidence) > EVIDENCE_CHARS:
        evidence = evidence[:EVIDENCE_CHARS] + " ..."
    return {"transform": str(get("transform") or "?"), "anchor": str(anchor) if anchor else "(no site)",
            "anchor_object": anchor if isinstance(anchor, Anchor) else None, "accepted": bool(accepted),
            "parent": get("parent"), "category": str(get("category") or ""),
            "reason": " ".join(str(get("reason") or "").split()), "evidence": evidence}


def _declared(vocabulary: list[dict[str, Any]], name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The feature names a catalog transform's backward step removes and adds; () for other:<name>."""
    for d in vocabulary:
        if d["name"] == name:
            return tuple(d.get("removes", ())), tuple(d.get("adds", ()))
    return (), ()


def _kernel_section(state: KernelState) -> str:
    fields = state.plan.to_dict()
    launches = fields.pop("launch")
    plan = "{\n" + "".join(f"  {json.dumps(k)}: {json.dumps(v)},\n" for k, v in fields.items()) + '  "launch": [\n'
    plan += ",\n".join(f"    {json.dumps(launch)}" for launch in launches) + "\n  ]\n}"
    return (f"# Launch plan (launch.toml, as JSON)\n```json\n{plan}\n```\n\n"
            f"# Kernel source (kernel.cu)\n```cuda\n{state.source.rstrip()}\n```")


__all__ = ["BACKWARD_SYSTEM", "Budget", "BudgetExhausted", "FAILED_TRANSFORM", "FORWARD_SYSTEM", "LLMProposal",
           "LLMRewriter", "Ledger", "Materialization", "Prices", "SCHEMA_NAME", "Usage", "answer_schema"]
