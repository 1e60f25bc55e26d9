"""Accounting for model calls: tokens and dollars per call and in total, against a budget.

Tokens come from the API's `usage` fields; when an endpoint sends none, they are estimated from
the text and the usage says so. Dollars need both prices (USD per million tokens); with either
unknown (0) the cost is unknown (None), tokens are still counted and the token budget still binds.
The budget is checked before each call against an estimate, and after it against what was spent.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any

from klineage import config
from klineage.errors import KLineageError

CHARS_PER_TOKEN = 3  # conservative for code: estimates run high, not low


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Prices:
    input_per_m: float = 0.0  # USD per million prompt tokens; 0 = unknown
    output_per_m: float = 0.0

    @property
    def known(self) -> bool:
        return self.input_per_m > 0 and self.output_per_m > 0

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        if not self.known:
            return None
        return (prompt_tokens * self.input_per_m + completion_tokens * self.output_per_m) / 1e6

    @classmethod
    def from_env(cls) -> Prices:
        return cls(config.llm_price_in(), config.llm_price_out())


@dataclass(frozen=True)
class Usage:
    """Tokens and cost of some calls; `cost_usd` is None when a price is unknown."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float | None = 0.0
    estimated: bool = False  # some counts were estimated because the endpoint sent no usage

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        cost = None if self.cost_usd is None or other.cost_usd is None else self.cost_usd + other.cost_usd
        return Usage(self.calls + other.calls, self.prompt_tokens + other.prompt_tokens,
                     self.completion_tokens + other.completion_tokens, cost, self.estimated or other.estimated)

    def to_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "cost_usd": self.cost_usd, "estimated": self.estimated}

    def describe(self) -> str:
        cost = "cost unknown (no price set)" if self.cost_usd is None else f"${self.cost_usd:.4f}"
        return (f"{self.calls} call(s), {self.total_tokens} tokens ({self.prompt_tokens} prompt + "
                f"{self.completion_tokens} completion{', partly estimated' if self.estimated else ''}), {cost}")


@dataclass(frozen=True)
class Budget:
    usd: float | None = config.LLM_DEFAULT_BUDGET_USD  # binds only when prices are known
    tokens: int | None = config.LLM_DEFAULT_BUDGET_TOKENS

    @classmethod
    def from_env(cls) -> Budget:
        return cls(config.llm_budget_usd(), config.llm_budget_tokens())

    def describe(self) -> str:
        parts = [f"{self.tokens} tokens" if self.tokens is not None else "",
                 f"${self.usd:.2f}" if self.usd is not None else ""]
        return " and ".join(p for p in parts if p) or "no limit"


class BudgetExhausted(KLineageError):
    """The model budget is spent (or the next call would overrun it); the walk must stop here."""

    def __init__(self, reason: str, spent: Usage, budget: Budget, estimate: Usage | None = None):
        self.reason, self.spent, self.budget, self.estimate = reason, spent, budget, estimate
        super().__init__(f"LLM budget exhausted: {reason}; spent {spent.describe()} of {budget.describe()}")

    @property
    def spent_tokens(self) -> int:
        return self.spent.total_tokens

    @property
    def spent_usd(self) -> float | None:
        return self.spent.cost_usd


class Ledger:
    """Cumulative spending of one workload; share one ledger between the rewriters it funds."""

    def __init__(self, budget: Budget | None = None, prices: Prices | None = None):
        self.budget = budget if budget is not None else Budget.from_env()
        self.prices = prices if prices is not None else Prices.from_env()
        self._spent = Usage(cost_usd=0.0 if self.prices.known else None)
        self._lock = threading.Lock()

    @property
    def spent(self) -> Usage:
        return self._spent

    def usage(self, prompt_tokens: int, completion_tokens: int, estimated: bool = False) -> Usage:
        """One call's usage, priced."""
        return Usage(1, prompt_tokens, completion_tokens, self.prices.cost(prompt_tokens, completion_tokens),
                     estimated)

    def check_before(self, prompt_tokens: int, completion_tokens: int) -> None:
        """Refuse a call whose estimated usage would take spending past the budget."""
        estimate = self.usage(prompt_tokens, completion_tokens, estimated=True)
        with self._lock:
            over = self._over(self._spent + estimate)
            if over:
                raise BudgetExhausted(f"the next call (estimated {estimate.total_tokens} tokens) would pass {over}",
                                      self._spent, self.budget, estimate)

    def record(self, usage: Usage) -> Usage:
        """Add one call's usage; raise if spending is now past the budget. Returns the total."""
        with self._lock:
            self._spent = self._spent + usage
            over = self._over(self._spent)
            if over:
                raise BudgetExhausted(f"the last call ({usage.total_tokens} tokens) passed {over}",
                                      self._spent, self.budget)
            return self._spent

    def _over(self, total: Usage) -> str:
        if self.budget.tokens is not None and total.total_tokens > self.budget.tokens:
            return f"the token budget ({self.budget.tokens})"
        if self.budget.usd is not None and total.cost_usd is not None and total.cost_usd > self.budget.usd:
            return f"the dollar budget (${self.budget.usd:.2f})"
        return ""

    def __repr__(self) -> str:
        return f"Ledger(spent={self._spent.describe()!r}, budget={self.budget.describe()!r})"
