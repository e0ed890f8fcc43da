"""The remedy code a report recommendation suggests, from its evidence."""

import pytest

from agent_otel.remedies.suggest import (
    DOCS,
    snippet_for,
    suggest_async_io,
    suggest_batch,
    suggest_bounded_queue,
    suggest_isolation,
    suggest_offload,
    suggest_offload_or_bound,
    suggest_pool_workers,
    suggest_process_pool,
    suggest_retries,
    suggest_timeout,
    suggested_timeout,
)
from agent_otel.report.recommendations import KINDS


@pytest.mark.parametrize("p99_s, timeout_s", [(1.4, 2.8), (0.123, 0.25), (7.0, 14.0), (64.0, 130.0)])
def test_the_suggested_timeout_is_twice_p99_to_two_significant_digits(p99_s, timeout_s):
    assert suggested_timeout(p99_s) == timeout_s


@pytest.mark.parametrize("p99_s, timeout_s", [(1.4, 2.1), (0.2, 0.3), (64.0, 96.0)])
def test_a_middle_tier_timeout_is_one_and_a_half_p99(p99_s, timeout_s):
    assert suggested_timeout(p99_s, 1.5) == timeout_s


def test_a_timeout_snippet_is_the_decorator_to_paste():
    assert suggest_timeout(1.4) == "@agent_otel.tool(timeout=2.8, retries=1, fallback=...)"
    assert suggest_timeout(0.3, retries=0) == "@agent_otel.tool(timeout=0.6, retries=0, fallback=...)"
    with pytest.raises(ValueError, match="p99"):
        suggest_timeout(0.0)


def test_pool_snippets_declare_the_pool_and_put_the_tools_on_it():
    assert suggest_pool_workers("io", 24) == 'agent_otel.pool("io", workers=24)\n@agent_otel.tool(pool="io")'
    # An unnamed ThreadPoolExecutor gets a name; asyncio's default executor is resized where it lives.
    assert suggest_pool_workers("ThreadPoolExecutor", 8).startswith('agent_otel.pool("io", workers=8)')
    assert "max_workers=16" in suggest_pool_workers("asyncio-default", 16)
    assert suggest_isolation("web_search", 3) == (
        'agent_otel.pool("web_search", workers=3)\n@agent_otel.tool(pool="web_search")'
    )
    # CPU-bound calls: a pool of processes (threads would take turns on the GIL)
    assert suggest_pool_workers("cpu", 2, processes=True) == (
        'agent_otel.pool("cpu", workers=2, kind="cpu", processes=True)\n@agent_otel.tool(pool="cpu")'
    )
    assert suggest_isolation("parse", 4, processes=True).startswith(
        'agent_otel.pool("parse", workers=4, kind="cpu", processes=True)'
    )


def test_offload_or_bound_and_retry_snippets():
    assert suggest_offload_or_bound("quote", 2.8, False) == (
        'agent_otel.pool("quote")\n@agent_otel.tool(pool="quote", timeout=2.8, retries=1, fallback=...)\n'
        "# in async code: result = await quote.aio(...)"
    )
    unbounded = suggest_offload_or_bound("parse", None, True)
    assert unbounded.startswith(
        'agent_otel.pool("parse", kind="cpu", processes=True)\n@agent_otel.tool(pool="parse")\n'
    )
    assert unbounded.endswith("# and a timeout near 2x its p99 once 20 calls tell it")
    assert (
        suggest_retries(0.28, 1, 0.1) == "@agent_otel.tool(timeout=0.28, retries=1, retry_interval=0.1, fallback=...)"
    )
    assert suggest_retries(None, 2, 0.1) == "@agent_otel.tool(timeout=..., retries=2, retry_interval=0.1, fallback=...)"


def test_a_batch_snippet_sizes_batches_from_the_bursts():
    assert suggest_batch(largest_burst=12, window_s=0.05) == "@agent_otel.batch(max_size=12, window_ms=50)"
    assert suggest_batch(largest_burst=1, window_s=0.0004) == "@agent_otel.batch(max_size=2, window_ms=1)"
    assert suggest_batch(largest_burst=8, window_s=0.012) == "@agent_otel.batch(max_size=8, window_ms=12)"


def test_a_bounded_queue_holds_twice_the_workers_then_the_caller_runs():
    assert suggest_bounded_queue("search", 4) == (
        'agent_otel.pool("search", workers=4, queue_limit=8, rejection="caller_runs")\n@agent_otel.tool(pool="search")'
    )
    assert suggest_bounded_queue("ThreadPoolExecutor-3", 2).startswith(
        'agent_otel.pool("io", workers=2, queue_limit=4,'
    )


def test_snippet_for_reads_the_evidence_the_report_writes():
    assert snippet_for(
        "set_timeout", {"tool": "finance_quote", "timeout_s": 30.0, "duration_p99_s": 1.4, "suggested_timeout_s": 2.8}
    ) == suggest_timeout(1.4)
    assert snippet_for("raise_pool_workers", {"executor": "io", "suggested_workers": 24}) == suggest_pool_workers(
        "io", 24
    )
    assert snippet_for(
        "isolate_tool", {"tool": "render_pdf", "executor": "io", "suggested_workers": 2}
    ) == suggest_isolation("render_pdf", 2)
    assert snippet_for(
        "batch_calls", {"tool": "embed", "largest_burst": 9, "burst_gap_s": 0.05, "suggested_window_s": 0.012}
    ) == suggest_batch(9, 0.012)
    assert snippet_for("bound_queue", {"executor": "io", "workers": 4}) == suggest_bounded_queue("io", 4)
    assert snippet_for("fewer_workers", {"executor": "io", "workers_before": 4}) == suggest_bounded_queue("io", 4)
    assert snippet_for("idle_not_tools", {"gpu": "0"}) is None
    assert snippet_for("offload_from_loop", {"tool": "lookup", "wait_kind": "io"}) == suggest_offload("lookup", False)
    assert snippet_for("offload_from_loop", {"tool": "parse", "wait_kind": "gil"}) == suggest_offload("parse", True)
    assert "processes=True" in suggest_offload("parse", True) and "await parse.aio(...)" in suggest_offload(
        "parse", True
    )
    assert snippet_for("offload_from_loop", {"tool": None}) is None  # code that is no tool
    assert snippet_for("use_process_pool", {"tool": "render"}) == suggest_process_pool("render")
    assert snippet_for("use_async_io", {"tool": "fetch"}) == suggest_async_io("fetch")
    assert snippet_for("overlap_tool_with_gpu", {"tool": "search", "gpu": "0"}) is None
    assert snippet_for(
        "set_timeout", {"tool": "quote", "duration_p99_s": 1.4, "timeout_factor": 1.5}
    ) == suggest_timeout(1.4, factor=1.5)
    assert snippet_for(
        "raise_pool_workers",
        {"executor": "shared", "suggested_workers": 8, "split_tool": "search", "split_tool_workers": 8},
    ) == suggest_pool_workers("shared", 8) + "\n" + suggest_isolation("search", 8)
    assert snippet_for(
        "offload_or_bound", {"tool": "quote", "suggested_timeout_s": 2.8, "wait_kind": "io"}
    ) == suggest_offload_or_bound("quote", 2.8, False)
    assert snippet_for(
        "hidden_retries",
        {"tool": "quote", "suggested_timeout_s": None, "suggested_retries": 1, "retry_interval_s": 0.1},
    ) == suggest_retries(None, 1, 0.1)
    assert set(DOCS) == set(KINDS)
