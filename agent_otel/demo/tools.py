"""The demo agent's tools, and the services behind them.

Four tools, each reproducing one classic case:

- ``search_docs`` calls a documentation search service that answers in
  0.35-0.65 s: fine alone, but it is the tool the conversations call most,
  so a pool too small for the load makes its calls queue.
- ``fetch_quote`` calls a slow external API (0.25-0.6 s) that, on 20% of
  attempts, hangs until the client's timeout.
- ``lookup_account`` calls a CRM API (0.3-0.7 s) through a synchronous
  client: called straight from the agent's async code, it holds the event
  loop until it returns.
- ``calculator`` runs in a few milliseconds: harmless.

Every latency is scripted: drawn from a random generator seeded with the
run's seed, the request id (conversation and turn) and the attempt number,
so the i-th turn of a conversation meets the same service latencies in both
runs, whatever order the calls happen in.
"""

from __future__ import annotations

import collections
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import agent_otel

SEARCH_S = (0.35, 0.65)
QUOTE_S = (0.25, 0.6)
ACCOUNT_S = (0.3, 0.7)
QUOTE_HANG_RATIO = 0.2
CALCULATOR_S = 0.005
CLIENT_TIMEOUT_S = 2.0  # the HTTP client's default: how long a hung attempt lasts

# As commonly written: the quote client retries a hung request twice more.
BASELINE_QUOTE_ATTEMPTS = 3
BASELINE_POOL_WORKERS = 2

# The fix: a pool per tool class, sized for the load, and a bounded wait on
# the slow API with one quick retry and a cached answer after that.
SEARCH_POOL = "demo-search"
QUOTE_POOL = "demo-quotes"
ACCOUNT_POOL = "demo-accounts"
FIXED_POOL_WORKERS = 8
FIXED_QUOTE_TIMEOUT_S = 0.8
FIXED_QUOTE_RETRIES = 1
FIXED_RETRY_INTERVAL_S = 0.05

TOOL_WEIGHTS = (("search_docs", 0.4), ("fetch_quote", 0.2), ("lookup_account", 0.2), ("calculator", 0.2))
TOPICS = ("rate limits", "refunds", "GPU quotas", "billing", "SSO setup", "data retention")
SYMBOLS = ("NVDA", "AMD", "TSM", "AVGO")
ACCOUNTS = ("acme", "globex", "initech", "umbrella", "hooli")
LAST_KNOWN_QUOTES = {"NVDA": 181.2, "AMD": 163.9, "TSM": 241.5, "AVGO": 301.4}


@dataclass(frozen=True)
class Turn:
    """What one conversation's model asks for at one turn: a tool and its argument."""

    conversation: int
    number: int
    tool: str
    argument: str

    @property
    def request_id(self) -> str:
        return f"c{self.conversation}-t{self.number}"


class Services:
    """The services the tools call, with seeded, scripted latencies.

    One instance per run: it counts attempts per request id, so a retried
    request meets its next scripted latency.
    """

    def __init__(self, seed: int):
        self.seed = seed
        self._attempts: collections.Counter = collections.Counter()
        self._lock = threading.Lock()

    def turn(self, conversation: int, number: int) -> Turn:
        rng = random.Random(f"{self.seed}/turn/{conversation}/{number}")
        tool = rng.choices([name for name, _ in TOOL_WEIGHTS], [weight for _, weight in TOOL_WEIGHTS])[0]
        if tool == "search_docs":
            argument = rng.choice(TOPICS)
        elif tool == "fetch_quote":
            argument = rng.choice(SYMBOLS)
        elif tool == "lookup_account":
            argument = rng.choice(ACCOUNTS)
        else:
            argument = f"{rng.randint(2, 99)} * {rng.randint(2, 99)}"
        return Turn(conversation, number, tool, argument)

    def latency(self, service: str, request_id: str, attempt: int) -> float:
        """Seconds the service takes to answer this attempt; ``inf`` when it hangs."""
        rng = random.Random(f"{self.seed}/{service}/{request_id}/{attempt}")
        if service == "docs":
            return rng.uniform(*SEARCH_S)
        if service == "crm":
            return rng.uniform(*ACCOUNT_S)
        if rng.random() < QUOTE_HANG_RATIO:
            return math.inf
        return rng.uniform(*QUOTE_S)

    def call(self, service: str, request_id: str, timeout: float = CLIENT_TIMEOUT_S) -> None:
        """Wait like a client waiting for the service; ``TimeoutError`` after ``timeout``."""
        with self._lock:
            attempt = self._attempts[(service, request_id)]
            self._attempts[(service, request_id)] += 1
        latency = self.latency(service, request_id, attempt)
        if latency > timeout:
            time.sleep(timeout)
            raise TimeoutError(f"{service} did not answer request {request_id} within {timeout:g} s")
        time.sleep(latency)


@dataclass
class Toolset:
    """One scenario's tools, by name; each takes (argument, request_id)."""

    search_docs: Callable
    fetch_quote: Callable
    lookup_account: Callable
    calculator: Callable

    def __getitem__(self, name: str) -> Any:  # a tool: a remedy wrapper has .aio
        return getattr(self, name)


def _search_docs(services: Services) -> Callable:
    def search_docs(query: str, request_id: str) -> list[str]:
        """Search the product documentation."""
        services.call("docs", request_id)
        return [f"{query}: section {len(query) % 7 + 1}"]

    return search_docs


def _lookup_account(services: Services) -> Callable:
    def lookup_account(account: str, request_id: str) -> dict:
        """Look up a customer account in the CRM (a synchronous HTTP client)."""
        services.call("crm", request_id)
        return {"account": account, "plan": "enterprise"}

    return lookup_account


def _calculator(services: Services) -> Callable:
    def calculator(expression: str, request_id: str) -> int:
        """Multiply two whole numbers."""
        time.sleep(CALCULATOR_S)
        left, right = expression.split("*")
        return int(left) * int(right)

    return calculator


def baseline_tools(services: Services) -> Toolset:
    """The tools as commonly written: plain ``@tool`` functions, a quote
    client with a long timeout and retries, and a sync CRM client."""

    def fetch_quote(symbol: str, request_id: str) -> float:
        """Latest price of a stock, from the market data API."""
        attempts_left = BASELINE_QUOTE_ATTEMPTS
        while True:
            try:
                services.call("quotes", request_id)
                return LAST_KNOWN_QUOTES[symbol]
            except TimeoutError:
                attempts_left -= 1
                if not attempts_left:
                    raise

    return Toolset(
        search_docs=agent_otel.tool(_search_docs(services)),
        fetch_quote=agent_otel.tool(fetch_quote),
        lookup_account=agent_otel.tool(_lookup_account(services)),
        calculator=agent_otel.tool(_calculator(services)),
    )


def declare_fixed_pools() -> None:
    """The fix's dedicated pools (declared once per process, the same way each time)."""
    agent_otel.pool(SEARCH_POOL, workers=FIXED_POOL_WORKERS)
    agent_otel.pool(QUOTE_POOL, workers=FIXED_POOL_WORKERS)
    agent_otel.pool(ACCOUNT_POOL, workers=FIXED_POOL_WORKERS)


def fixed_tools(services: Services) -> Toolset:
    """The same tools with the remedies: a pool per tool class (the sync CRM
    client's awaited with ``.aio()``, off the event loop), and the quote API
    bounded by a timeout, one retry and the last known price."""
    declare_fixed_pools()

    def fetch_quote(symbol: str, request_id: str) -> float:
        """Latest price of a stock, from the market data API."""
        services.call("quotes", request_id)
        return LAST_KNOWN_QUOTES[symbol]

    def last_known_quote(symbol: str, request_id: str) -> float:
        return LAST_KNOWN_QUOTES[symbol]

    return Toolset(
        search_docs=agent_otel.tool(pool=SEARCH_POOL)(_search_docs(services)),
        fetch_quote=agent_otel.tool(
            pool=QUOTE_POOL,
            timeout=FIXED_QUOTE_TIMEOUT_S,
            retries=FIXED_QUOTE_RETRIES,
            retry_interval=FIXED_RETRY_INTERVAL_S,
            fallback=last_known_quote,
        )(fetch_quote),
        lookup_account=agent_otel.tool(pool=ACCOUNT_POOL)(_lookup_account(services)),
        calculator=agent_otel.tool(_calculator(services)),
    )
