"""The LLM rewriter over real HTTP, through the real `openai` client, against a scripted local server."""

from __future__ import annotations

import json

import pytest

from klineage import config
from klineage.errors import KLineageError
from klineage.kernel import KernelState
from klineage.launch import LaunchPlan
from klineage.rewriters.base import Attempt, AttemptOutcome, History, Proposal, Rewriter
from klineage.rewriters.llm import (
    FAILED_TRANSFORM,
    SCHEMA_NAME,
    BudgetExhausted,
    LLMProposal,
    LLMRewriter,
    Materialization,
    answer_schema,
)
from klineage.rewriters.llm_budget import Budget, Ledger, Prices
from klineage.transforms.base import Anchor, Direction, NotApplicable, Role, Transform
from llm_server import ScriptedLLMServer

KEY = "sk-test-DO-NOT-LEAK-5f1c2a9e"

PLAN = """\
name = "scale"
problem = "scale"

[[launch]]
entry = "scale"
grid = ["cdiv(n, THREADS * 4)"]
block = ["THREADS"]
args = ["x", "y", { scalar = "n" }]
"""

SOURCE = """\
constexpr int THREADS = 256;

extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = (blockIdx.x * THREADS + threadIdx.x) * 4;
    if (n % 4 == 0 && i + 3 < n) {
        float4 v = *reinterpret_cast<const float4*>(x + i);
        v.x *= 2.0f; v.y *= 2.0f; v.z *= 2.0f; v.w *= 2.0f;
        *reinterpret_cast<float4*>(y + i) = v;
    } else {
        for (int j = i; j < i + 4 && j < n; ++j) y[j] = 2.0f * x[j];
    }
}
"""

EDITED = """\
constexpr int THREADS = 256;

extern "C" __global__ void scale(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = (blockIdx.x * THREADS + threadIdx.x) * 4;
    for (int j = i; j < i + 4 && j < n; ++j) y[j] = 2.0f * x[j];
}
"""


class _Fake(Transform):
    def find(self, state):
        return []

    def backward(self, state, anchor):
        raise NotApplicable("test vocabulary only")


class Devectorize(_Fake):
    name = "devectorize"
    intent = "load and store through 128-bit vector accesses where alignment allows"
    removes = ("vector_load_128", "vector_store_128")


class Unpipeline(_Fake):
    name = "unpipeline"
    intent = "overlap global loads with compute through a multi-stage cp.async pipeline"
    removes = ("cp_async_pipeline",)
    after = ("remove_mma",)


class TileSize(_Fake):
    name = "tile_size"
    intent = "pick the tile size"
    role = Role.CARRIER


TRANSFORMS = [Devectorize(), Unpipeline(), TileSize()]


def answer(**overrides):
    data = {"transform": "devectorize", "anchor": {"function": "scale", "kind": "declaration", "key": "v"},
            "rationale": "the float4 path goes; the scalar loop covers every n", "source": EDITED,
            "plan_changes": None}
    data.update(overrides)
    return data


@pytest.fixture
def server():
    with ScriptedLLMServer() as running:
        yield running


@pytest.fixture
def state():
    return KernelState(SOURCE, LaunchPlan.from_toml(PLAN))


def rewriter(server, **kwargs):
    kwargs.setdefault("transforms", TRANSFORMS)
    kwargs.setdefault("budget", Budget(usd=10.0, tokens=1_000_000))
    kwargs.setdefault("prices", Prices())
    return LLMRewriter(model="test-model", base_url=server.base_url, api_key=KEY, **kwargs)


def propose(rw, state, history=()):
    proposals = list(rw.propose(state, history))
    assert len(proposals) == 1
    return proposals[0]


# answers that work


def test_valid_answer_becomes_a_proposal(server, state):
    server.answer(answer(), usage=(1200, 300))
    rw = rewriter(server)
    p = propose(rw, state)
    assert isinstance(rw, Rewriter) and rw.name == "llm"
    assert isinstance(p, LLMProposal) and isinstance(p, Proposal) and p.applicable and not p.failed
    assert p.transform == "devectorize" and p.in_catalog
    assert p.anchor == Anchor("scale", "declaration", "v")
    assert p.state.source == EDITED and p.state.plan == state.plan and not p.plan_changed
    assert p.rewrite.direction is Direction.BACKWARD and p.rewrite.anchor == p.anchor
    assert p.rewrite.removes == ("vector_load_128", "vector_store_128")  # declared by the catalog entry
    assert p.rationale.startswith("the float4 path goes") and p.rewrite.note == p.rationale
    assert str(p) == "devectorize at scale/declaration:v"
    assert (p.attempts, p.malformed, p.errors) == (1, 0, ())
    assert (p.usage.calls, p.usage.prompt_tokens, p.usage.completion_tokens) == (1, 1200, 300)
    assert p.usage.cost_usd is None  # no price set: cost unknown, tokens still counted
    assert rw.spent.total_tokens == 1500 and rw.calls == 1
    assert p.to_dict()["rewrite"]["kernel"]["source"] == EDITED


def test_prompt_holds_source_plan_vocabulary_history_and_instruction(server, state):
    server.answer(answer())
    elsewhere = "0" * 64  # an earlier kernel of the walk
    history = History([
        Attempt(1, elsewhere, "unpipeline", Anchor("scale", "loop", "loop:k#0"), AttemptOutcome.ACCEPTED,
                evidence="1.01x, 3 trials"),
        Attempt(2, state.fingerprint, "devectorize", Anchor("scale", "declaration", "w"), AttemptOutcome.REJECTED,
                category="correctness", reason="max abs error 7.5 at case n=1023", evidence='{"max_abs": 7.5}'),
        {"transform": "restrict", "anchor": {"function": "scale", "kind": "function", "key": "scale"},
         "status": "rejected", "category": "speed", "reason": "0.97x", "evidence": {"trials": [0.97, 0.98]}},
    ])
    propose(rewriter(server), state, history)
    prompt = server.requests[0].prompt
    assert SOURCE.rstrip() in prompt
    assert '"cdiv(n, THREADS * 4)"' in prompt  # the launch plan
    for t in TRANSFORMS:
        assert f"- {t.name}: intent: {t.intent}" in prompt
    assert "removes: vector_load_128, vector_store_128" in prompt
    assert "remove after: remove_mma" in prompt
    assert "carrier tuning, not a skill" in prompt
    assert "1. unpipeline at scale/loop:loop:k#0" in prompt and "1.01x, 3 trials" in prompt
    assert ("1. devectorize at scale/declaration:w [tried at this kernel] - correctness: max abs error 7.5 at "
            "case n=1023 (evidence: {\"max_abs\": 7.5})") in prompt
    assert '2. restrict at scale/function:scale - speed: 0.97x (evidence: {"trials": [0.97, 0.98]})' in prompt
    accepted_at, rejected_at = prompt.index("Accepted steps"), prompt.index("Rejected steps")
    assert accepted_at < prompt.index("1. unpipeline") < rejected_at < prompt.index("1. devectorize at")
    assert "exactly ONE mechanism at ONE locus" in prompt
    assert "every case" in prompt


def test_request_asks_for_the_strict_schema(server, state):
    server.answer(answer())
    propose(rewriter(server), state)
    body = server.requests[0].body
    assert body["model"] == "test-model"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    assert fmt["json_schema"]["name"] == SCHEMA_NAME and fmt["json_schema"]["strict"] is True
    schema = fmt["json_schema"]["schema"]
    assert schema == answer_schema([t.name for t in TRANSFORMS])
    assert schema["required"] == ["transform", "anchor", "rationale", "source", "plan_changes"]
    assert schema["additionalProperties"] is False and schema["properties"]["anchor"]["additionalProperties"] is False


def test_other_transform_and_plan_changes(server, state):
    server.answer(answer(transform="other:scalarize_tail",
                         plan_changes=[{"launch": 0, "grid": ["cdiv(n, 256)"], "block": ["128"], "shared": None}]))
    p = propose(rewriter(server), state)
    assert not p.failed and p.transform == "other:scalarize_tail" and not p.in_catalog
    assert p.plan_changed
    launch = p.state.plan.launches[0]
    assert launch.grid == ("cdiv(n, 256)", 1, 1) and launch.block == (128, 1, 1)
    assert launch.args == state.plan.launches[0].args


def test_default_vocabulary_is_the_catalog(server, state):
    from klineage.transforms import catalog

    server.answer(answer(transform="other:devectorize"))
    rw = LLMRewriter(model="m", base_url=server.base_url, api_key=KEY, budget=Budget(tokens=100_000))
    assert [d["name"] for d in rw.vocabulary()] == sorted(catalog())
    assert not propose(rw, state).failed


# malformed answers


def test_malformed_json_is_retried_and_counted(server, state):
    server.text('{"transform": "devectorize", "anchor": ')
    server.answer(answer())
    rw = rewriter(server)
    p = propose(rw, state)
    assert not p.failed and p.state.source == EDITED
    assert (p.attempts, p.malformed, rw.malformed) == (2, 1, 1)
    assert "not valid JSON" in p.errors[0]
    follow_up = server.requests[1].messages
    assert [m["role"] for m in follow_up] == ["system", "user", "assistant", "user"]
    assert follow_up[2]["content"] == '{"transform": "devectorize", "anchor": '
    assert "not valid JSON" in follow_up[3]["content"]
    assert p.usage.calls == 2 and rw.spent.total_tokens == 300


def test_schema_violation_is_retried(server, state):
    bad = answer(extra="field")
    del bad["rationale"]
    server.answer(bad)
    server.answer(answer())
    p = propose(rewriter(server), state)
    assert not p.failed and p.malformed == 1
    assert "does not match the schema" in p.errors[0]
    assert "'rationale' is a required property" in p.errors[0] and "extra" in p.errors[0]
    assert "'rationale' is a required property" in server.requests[1].messages[-1]["content"]


def test_unparsable_source_is_retried_with_the_parser_error(server, state):
    broken = EDITED.replace("for (int j = i;", "for (int j = i;;; {")
    server.answer(answer(source=broken))
    server.answer(answer())
    p = propose(rewriter(server), state)
    assert not p.failed and p.malformed == 1
    feedback = server.requests[1].messages[-1]["content"]
    assert "the source does not parse: line 5" in feedback
    assert p.errors[0] in feedback


@pytest.mark.parametrize("bad, expected", [
    (answer(source=SOURCE), "identical to the input"),
    (answer(source="  \n"), "the source is empty"),
    (answer(source=SOURCE + "\n\n   \n"), "identical to the input"),  # trailing blanks change nothing
    (answer(transform="unroll_everything"), "unknown transform 'unroll_everything'"),
    (answer(transform="other:Bad Name"), "unknown transform"),
    (answer(anchor={"function": "scale", "kind": " ", "key": "v"}), "non-empty function, kind and key"),
    (answer(source='#include <cublas_v2.h>\n' + EDITED), "static check: [include]"),
    (answer(source=EDITED.replace("scale(", "scale2(")), "[plan_entry]"),
    (answer(plan_changes=[{"launch": 3, "grid": None, "block": None, "shared": "1024"}]), "launch 3 does not exist"),
    (answer(plan_changes=[{"launch": 0, "grid": [], "block": None, "shared": None}]), "1 to 3 expressions"),
    (answer(plan_changes=[{"launch": 0, "grid": None, "block": None, "shared": "__import__('os')"}]), "plan_changes"),
])
def test_other_malformed_answers_are_retried(server, state, bad, expected):
    server.answer(bad)
    server.answer(answer())
    p = propose(rewriter(server), state)
    assert not p.failed and p.malformed == 1
    assert expected in p.errors[0], p.errors[0]
    assert expected in server.requests[1].messages[-1]["content"]


def test_fenced_json_is_accepted(server, state):
    server.text("```json\n" + json.dumps(answer()) + "\n```")
    assert not propose(rewriter(server), state).failed


def test_cut_off_answer_is_malformed(server, state):
    server.text(json.dumps(answer())[:50], finish_reason="length")
    server.answer(answer())
    p = propose(rewriter(server), state)
    assert not p.failed and "cut off" in p.errors[0]


def test_exhausting_retries_gives_a_failed_proposal(server, state):
    for _ in range(3):
        server.text("not json at all")
    rw = rewriter(server, max_retries=2)
    p = propose(rw, state)
    assert p.failed and p.failure == "malformed" and p.state is None and p.anchor is None
    assert isinstance(p, Proposal) and not p.applicable and p.transform == FAILED_TRANSFORM
    assert p.not_applicable_reason == p.reason
    assert len(server.requests) == 3 and p.attempts == 3 and p.malformed == 3 and rw.malformed == 3
    assert "3 answer(s) failed the checks" in p.reason and "not valid JSON" in p.reason
    assert p.usage.calls == 3 and rw.spent.total_tokens == 450
    # the conversation grows with each rejected answer and its reason
    assert len(server.requests[2].messages) == 6


def test_zero_retries_means_one_answer(server, state):
    server.text("nope")
    p = propose(rewriter(server, max_retries=0), state)
    assert p.failed and len(server.requests) == 1


# the endpoint failing


def test_http_500_is_retried_by_the_client(server, state):
    server.error(500)
    server.answer(answer())
    rw = rewriter(server)
    p = propose(rw, state)
    assert not p.failed and len(server.requests) == 2
    assert rw.malformed == 0 and p.usage.calls == 1


def test_http_500_retries_are_bounded(server, state):
    for _ in range(5):
        server.error(500, "the model is on fire")
    rw = rewriter(server, max_retries=2)
    p = propose(rw, state)
    assert p.failed and p.failure == "endpoint"
    assert "HTTP 500" in p.reason and "the model is on fire" in p.reason
    assert len(server.requests) == 3  # one request and the client's two retries; no retries of ours on top
    assert rw.endpoint_failures == 1 and rw.spent.total_tokens == 0


def test_rate_limit_honours_retry_after(server, state):
    server.rate_limited(retry_after=0.05)
    server.answer(answer())
    p = propose(rewriter(server), state)
    assert not p.failed and len(server.requests) == 2


def test_client_error_is_not_retried(server, state):
    server.error(400, "bad request: unknown parameter")
    p = propose(rewriter(server), state)
    assert p.failed and p.failure == "endpoint" and "HTTP 400" in p.reason and len(server.requests) == 1


# the budget


def test_token_budget_smaller_than_one_call_stops_the_walk(server, state):
    server.answer(answer(), usage=(20_000, 1_500))
    rw = rewriter(server, budget=Budget(usd=10.0, tokens=10_000))
    with pytest.raises(BudgetExhausted) as caught:
        propose(rw, state)
    assert caught.value.spent_tokens == 21_500 and caught.value.spent.calls == 1
    assert "21500 tokens" in str(caught.value) and "10000 tokens" in str(caught.value)
    assert caught.value.spent_usd is None  # price unknown
    # spending is past the budget: the next call is refused before it is made
    with pytest.raises(BudgetExhausted):
        propose(rw, state)
    assert len(server.requests) == 1


def test_budget_is_checked_before_the_call(server, state):
    server.answer(answer())
    rw = rewriter(server, budget=Budget(tokens=200))  # less than the prompt alone
    with pytest.raises(BudgetExhausted) as caught:
        propose(rw, state)
    assert caught.value.spent_tokens == 0 and caught.value.estimate.total_tokens > 200
    assert "next call" in str(caught.value)
    assert server.requests == []


def test_dollar_budget_with_known_prices(server, state):
    server.answer(answer(), usage=(1_000_000, 100_000))
    server.answer(answer(), usage=(1_000_000, 100_000))
    ledger = Ledger(Budget(usd=5.0, tokens=None), Prices(input_per_m=2.0, output_per_m=8.0))
    rw = rewriter(server, ledger=ledger)
    p = propose(rw, state)
    assert p.usage.cost_usd == pytest.approx(2.8)
    with pytest.raises(BudgetExhausted) as caught:
        propose(rw, state)
    assert caught.value.spent_usd == pytest.approx(5.6) and "dollar budget" in str(caught.value)


def test_a_shared_ledger_counts_every_rewriter(server, state):
    server.answer(answer(), usage=(100, 50))
    server.answer(answer(), usage=(100, 50))
    ledger = Ledger(Budget(tokens=100_000), Prices())
    propose(rewriter(server, ledger=ledger), state)
    propose(rewriter(server, ledger=ledger), state)
    assert ledger.spent.calls == 2 and ledger.spent.total_tokens == 300


def test_missing_usage_is_estimated(server, state):
    server.text(json.dumps(answer()), usage=None)
    p = propose(rewriter(server), state)
    assert not p.failed and p.usage.estimated and p.usage.prompt_tokens > 0 and p.usage.completion_tokens > 0


# the API key


def test_api_key_never_leaks(server, state):
    server.text("not json")
    server.answer(answer())
    server.error(500)
    server.error(500)
    server.error(500)
    server.answer(answer(), usage=(900_000, 200_000))
    rw = rewriter(server, budget=Budget(tokens=1_000_000))
    ok = propose(rw, state)
    failed = propose(rw, state)
    with pytest.raises(BudgetExhausted) as caught:
        propose(rw, state)
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"  # sent, as a header only
    for request in server.requests:
        assert KEY not in request.raw
    for thing in (rw, ok, failed, caught.value, rw.ledger, ok.usage):
        assert KEY not in repr(thing) and KEY not in str(thing)
    assert KEY not in json.dumps(ok.to_dict()) and KEY not in json.dumps(failed.to_dict())
    assert "test-model" in repr(rw)


def test_key_echoed_by_an_endpoint_is_redacted(server, state):
    server.error(401, f"invalid key {KEY}")
    p = propose(rewriter(server), state)
    assert p.failed and KEY not in p.reason and "[redacted]" in p.reason


# settings


def test_environment_settings_are_honoured(server, state, monkeypatch):
    monkeypatch.setenv("KLINEAGE_LLM_BASE_URL", server.base_url)
    monkeypatch.setenv("KLINEAGE_LLM_MODEL", "env-model")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("KLINEAGE_LLM_MAX_RETRIES", "1")
    monkeypatch.setenv("KLINEAGE_LLM_BUDGET_TOKENS", "123456")
    monkeypatch.setenv("KLINEAGE_LLM_BUDGET_USD", "3.5")
    monkeypatch.setenv("KLINEAGE_LLM_PRICE_IN", "1.25")
    monkeypatch.setenv("KLINEAGE_LLM_PRICE_OUT", "10")
    server.text("bad")
    server.text("bad again")
    rw = LLMRewriter(transforms=TRANSFORMS)
    assert rw.model == "env-model" and rw.max_retries == 1
    assert rw.ledger.budget == Budget(usd=3.5, tokens=123456)
    assert rw.ledger.prices == Prices(1.25, 10.0)
    p = propose(rw, state)
    assert p.failed and len(server.requests) == 2  # one retry, as configured
    assert server.requests[0].body["model"] == "env-model"
    assert server.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert p.usage.cost_usd == pytest.approx(2 * (100 * 1.25 + 50 * 10) / 1e6)
    assert KEY not in repr(rw)


def test_setting_defaults(monkeypatch):
    for name in ("KLINEAGE_LLM_BASE_URL", "KLINEAGE_LLM_MODEL", "OPENAI_API_KEY", "KLINEAGE_LLM_MAX_RETRIES",
                 "KLINEAGE_LLM_BUDGET_USD", "KLINEAGE_LLM_BUDGET_TOKENS", "KLINEAGE_LLM_PRICE_IN",
                 "KLINEAGE_LLM_PRICE_OUT"):
        monkeypatch.delenv(name, raising=False)
    assert config.llm_base_url() is None and config.llm_model() is None and config.llm_api_key() is None
    assert config.llm_max_retries() == 2 and config.llm_budget_usd() == 10.0
    assert config.llm_price_in() == 0.0 and config.llm_price_out() == 0.0
    assert config.llm_budget_tokens() == config.LLM_DEFAULT_BUDGET_TOKENS
    with pytest.raises(KLineageError, match="KLINEAGE_LLM_MODEL"):
        LLMRewriter()
    with pytest.raises(KLineageError, match="OPENAI_API_KEY"):
        LLMRewriter(model="m")  # neither a key nor a local endpoint


@pytest.mark.parametrize("name, value", [("KLINEAGE_LLM_MAX_RETRIES", "two"), ("KLINEAGE_LLM_MAX_RETRIES", "-1"),
                                         ("KLINEAGE_LLM_BUDGET_USD", "nan"), ("KLINEAGE_LLM_PRICE_IN", "-3"),
                                         ("KLINEAGE_LLM_BUDGET_TOKENS", "1.5")])
def test_bad_settings_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    getter = {"KLINEAGE_LLM_MAX_RETRIES": config.llm_max_retries, "KLINEAGE_LLM_BUDGET_USD": config.llm_budget_usd,
              "KLINEAGE_LLM_PRICE_IN": config.llm_price_in, "KLINEAGE_LLM_BUDGET_TOKENS": config.llm_budget_tokens}
    with pytest.raises(KLineageError, match=name):
        getter[name]()


def test_local_endpoint_needs_no_key(server, state, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    server.answer(answer())
    rw = LLMRewriter(model="local", base_url=server.base_url, transforms=TRANSFORMS, budget=Budget(tokens=10**6))
    assert not propose(rw, state).failed


# materialize


def test_materialize_applies_a_card(server, state):
    naive = KernelState(EDITED, state.plan)
    server.answer(answer(source=SOURCE, rationale="float4 path added where n % 4 == 0"))
    card = {"skill_id": "vectorize-rows", "transform": "devectorize", "intent": "use 128-bit accesses",
            "anchor": {"function": "scale", "kind": "declaration", "key": "v"},
            "preconditions": ["n % 4 == 0 for the vector path"], "vector": "float4 v = *reinterpret_cast<...>"}
    m = rewriter(server).materialize(naive, card)
    assert isinstance(m, Materialization) and not m.failed and m.state.source == SOURCE
    assert m.rewrite.direction is Direction.FORWARD and m.rewrite.adds == ("vector_load_128", "vector_store_128")
    prompt = server.requests[0].prompt
    assert "apply one verified optimization skill" in prompt and "use 128-bit accesses" in prompt
    assert "n % 4 == 0 for the vector path" in prompt and EDITED.rstrip() in prompt
    assert "Name the transform 'devectorize'" in prompt
    assert "Walk so far" not in prompt


def test_materialize_failure_is_reported(server, state):
    for _ in range(3):
        server.text("{}")
    m = rewriter(server).materialize(state, {"transform": "other:vectorize", "intent": "vectorize"})
    assert m.failed and m.rewrite is None and m.transform == "other:vectorize" and "required property" in m.reason


def test_an_answer_repeating_a_rejected_step_is_retried(server, state):
    history = History([Attempt(1, state.fingerprint, "devectorize", Anchor("scale", "declaration", "v"),
                               AttemptOutcome.REJECTED, category="correctness", reason="wrong at n=3")])
    server.answer(answer())
    server.answer(answer(transform="other:scalar_tail",
                         anchor={"function": "scale", "kind": "loop", "key": "loop:j#0"}))
    p = propose(rewriter(server), state, history)
    assert not p.failed and p.transform == "other:scalar_tail" and p.rewrite.removes == ()
    assert "already tried at this kernel and rejected (correctness: wrong at n=3)" in p.errors[0]
