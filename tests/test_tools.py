"""@tool and tool_span as a user's agent uses them."""

import asyncio
import functools
import inspect
import time
import traceback

import pytest
from opentelemetry import trace
from opentelemetry.trace import StatusCode

import agent_otel


def attrs(span):
    return dict(span.attributes)


def test_direct_call_makes_one_span_with_queue_and_exec(agent, spans):
    @agent_otel.tool
    def search(query: str) -> list[str]:
        """Search the web."""
        time.sleep(0.05)
        return [query]

    assert search("gpu") == ["gpu"]
    (span,) = spans.tools("search")
    a = attrs(span)
    assert span.name == "execute_tool search"
    assert span.kind == trace.SpanKind.INTERNAL
    assert a["gen_ai.operation.name"] == "execute_tool"
    assert a["gen_ai.tool.type"] == "function"
    assert a["gen_ai.tool.description"] == "Search the web."
    assert a["agent.tool.executor"] == "direct"
    assert a["agent.tool.outcome"] == "ok"
    assert a["agent.tool.queue.duration"] == 0.0
    assert 0.05 <= a["agent.tool.exec.duration"] < 0.5
    duration = (span.end_time - span.start_time) / 1e9
    assert abs(duration - a["agent.tool.exec.duration"]) < 1e-6
    assert span.events == ()  # execution began with the span: exec.start marks only queued calls
    assert "gen_ai.tool.call.arguments" not in a and "gen_ai.tool.call.result" not in a


def test_name_can_be_given(agent, spans):
    @agent_otel.tool(name="web_search", description="Looks things up")
    def search(q):
        return q

    search("x")
    (span,) = spans.tools()
    assert span.name == "execute_tool web_search"
    assert attrs(span)["gen_ai.tool.description"] == "Looks things up"


def _sync(a: int, b: str = "x") -> str:
    """Sync doc."""
    return f"{a}{b}"


async def _coro(a: int, *, b: float = 1.0) -> float:
    """Async doc."""
    await asyncio.sleep(0)
    return a * b


def _gen(n: int):
    """Gen doc."""
    for i in range(n):
        yield i
    return "done"


async def _agen(n: int):
    """Agen doc."""
    for i in range(n):
        await asyncio.sleep(0)
        yield i


@pytest.mark.parametrize(
    "fn,check",
    [
        (_sync, inspect.isfunction),
        (_coro, inspect.iscoroutinefunction),
        (_gen, inspect.isgeneratorfunction),
        (_agen, inspect.isasyncgenfunction),
    ],
)
def test_wrapper_keeps_what_frameworks_read(fn, check):
    wrapped = agent_otel.tool(fn)
    assert wrapped.__wrapped__ is fn
    assert wrapped.__name__ == fn.__name__
    assert wrapped.__doc__ == fn.__doc__
    assert wrapped.__annotations__ == fn.__annotations__
    assert inspect.signature(wrapped) == inspect.signature(fn)
    assert check(wrapped)
    assert inspect.iscoroutinefunction(wrapped) == inspect.iscoroutinefunction(fn)


def test_partial_method_and_staticmethod(agent, spans):
    def lookup(table: str, key: int) -> str:
        return f"{table}:{key}"

    users = agent_otel.tool(functools.partial(lookup, "users"), name="users")
    assert inspect.signature(users) == inspect.signature(functools.partial(lookup, "users"))
    assert users(7) == "users:7"

    class Tools:
        def __init__(self, prefix):
            self.prefix = prefix

        @agent_otel.tool
        def greet(self, name: str) -> str:
            return self.prefix + name

        @agent_otel.tool
        @staticmethod
        def add(a, b):
            return a + b

    assert Tools("hi ").greet("ann") == "hi ann"
    assert Tools.add(1, 2) == 3
    assert sorted(s.attributes["gen_ai.tool.name"] for s in spans.tools()) == ["add", "greet", "users"]


def test_without_instrument_nothing_is_recorded(spans):
    calls = []

    @agent_otel.tool
    def f(x):
        calls.append(x)
        return x * 2

    assert f(2) == 4
    assert calls == [2]
    assert spans.tools() == []


def test_exception_passes_through_unchanged(agent, spans):
    class QuotaExceeded(Exception):
        pass

    error = QuotaExceeded("limit")

    @agent_otel.tool
    def quote(symbol):
        raise error

    with pytest.raises(QuotaExceeded) as caught:
        quote("NVDA")
    assert caught.value is error
    frames = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert frames[-1] == "quote"  # the user's own frame is where it was raised
    (span,) = spans.tools("quote")
    a = attrs(span)
    assert a["agent.tool.outcome"] == "error"
    assert a["error.type"] == f"{__name__}.test_exception_passes_through_unchanged.<locals>.QuotaExceeded"
    assert span.status.status_code == StatusCode.ERROR
    assert any(e.name == "exception" for e in span.events)


def test_builtin_error_type_is_short(agent, spans):
    @agent_otel.tool
    def parse(x):
        return int(x)

    with pytest.raises(ValueError):
        parse("nope")
    assert attrs(spans.tools("parse")[0])["error.type"] == "ValueError"


def test_an_error_type_of_a_huge_class_name_is_cut_and_the_exception_passes_through(agent, spans):
    huge = type("Quota" + "x" * 1_900_000, (Exception,), {})  # a class made at run time: any name
    error = huge("limit")

    @agent_otel.tool
    def quote(symbol):
        raise error

    with pytest.raises(huge) as caught:
        quote("NVDA")
    assert caught.value is error
    error_type = attrs(spans.tools("quote")[0])["error.type"]
    assert len(error_type) == 512 and error_type.startswith(f"{__name__}.Quotaxxx") and error_type.endswith("…")


def test_timeout_inside_and_around_the_tool(agent, spans):
    @agent_otel.tool
    def slow_api():
        raise TimeoutError("upstream took too long")

    with pytest.raises(TimeoutError):
        slow_api()
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(1) as pool:
        future = pool.submit(time.sleep, 0.3)
        with pytest.raises(cf.TimeoutError):
            with agent_otel.tool_span("wait_for_sleep"):
                future.result(timeout=0.01)
    assert attrs(spans.tools("slow_api")[0])["agent.tool.outcome"] == "timeout"
    (waited,) = spans.tools("wait_for_sleep")
    assert attrs(waited)["agent.tool.outcome"] == "timeout"
    assert attrs(waited)["error.type"] == "TimeoutError"


def test_cancellation_is_recorded_and_reraised(agent, spans):
    started = asyncio.Event()

    @agent_otel.tool
    async def long_poll():
        started.set()
        await asyncio.sleep(10)

    async def main():
        task = asyncio.create_task(long_poll())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    (span,) = spans.tools("long_poll")
    assert attrs(span)["agent.tool.outcome"] == "cancelled"
    assert span.status.status_code != StatusCode.ERROR


def test_async_tool(agent, spans):
    @agent_otel.tool
    async def fetch(url: str) -> str:
        await asyncio.sleep(0.05)
        return url.upper()

    async def main():
        return await asyncio.gather(fetch("a"), fetch("b"))

    assert asyncio.run(main()) == ["A", "B"]
    found = spans.tools("fetch")
    assert len(found) == 2
    for span in found:
        assert 0.05 <= attrs(span)["agent.tool.exec.duration"] < 0.5
        assert attrs(span)["agent.tool.queue.duration"] == 0.0


def test_generator_span_covers_iteration_and_parents_inner_spans(agent, spans):
    tracer = trace.get_tracer("test")

    @agent_otel.tool
    def rows(n):
        for i in range(n):
            with tracer.start_as_current_span("fetch_row"):
                time.sleep(0.01)
            yield i
        return "end"

    outside = []
    for _row in rows(3):
        outside.append(trace.get_current_span())
    (span,) = spans.tools("rows")
    inner = [s for s in spans.all() if s.name == "fetch_row"]
    assert len(inner) == 3
    assert all(s.parent.span_id == span.context.span_id for s in inner)
    # The consumer's code between items does not run inside the tool span.
    assert all(s is not None and s.get_span_context().span_id != span.context.span_id for s in outside)
    assert attrs(span)["agent.tool.exec.duration"] >= 0.03


def test_generator_return_value_and_early_close(agent, spans):
    @agent_otel.tool
    def numbers():
        yield 1
        yield 2
        return "finished"

    def consume():
        result = yield from numbers()
        return result

    gen = consume()
    assert list(gen) == [1, 2]
    early = numbers()
    assert next(early) == 1
    early.close()
    outcomes = sorted(attrs(s)["agent.tool.outcome"] for s in spans.tools("numbers"))
    assert outcomes == ["cancelled", "ok"]


def test_async_generator(agent, spans):
    @agent_otel.tool
    async def stream(n):
        for i in range(n):
            await asyncio.sleep(0.01)
            yield i

    async def main():
        return [i async for i in stream(3)]

    assert asyncio.run(main()) == [0, 1, 2]
    (span,) = spans.tools("stream")
    assert attrs(span)["agent.tool.outcome"] == "ok"
    assert attrs(span)["agent.tool.exec.duration"] >= 0.03


@pytest.mark.parametrize("instrumented", [False, True])
def test_async_generator_passes_asend_and_aclose_through(spans, instrumented):
    closed = []

    @agent_otel.tool
    async def echo():
        got = None
        try:
            while True:
                got = yield got
        finally:
            closed.append(True)

    async def main():
        stream = echo()
        await stream.asend(None)
        echoed = await stream.asend(5)
        await stream.aclose()
        return echoed, list(closed)  # closed by the time aclose() returns

    if instrumented:
        agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())
    try:
        assert asyncio.run(main()) == (5, [True])
    finally:
        agent_otel.uninstrument()
    assert len(spans.tools("echo")) == (1 if instrumented else 0)


def test_tool_span_sync_and_async(agent, spans):
    with agent_otel.tool_span("sql", call_id="call-1") as span:
        span.set_attribute("db.system", "sqlite")

    async def main():
        async with agent_otel.tool_span("http"):
            await asyncio.sleep(0.01)

    asyncio.run(main())
    (sql,) = spans.tools("sql")
    assert attrs(sql)["gen_ai.tool.call.id"] == "call-1"
    assert attrs(sql)["db.system"] == "sqlite"
    assert attrs(spans.tools("http")[0])["agent.tool.exec.duration"] >= 0.01


def test_tool_span_without_instrument_is_inert(spans):
    with agent_otel.tool_span("sql") as span:
        assert not span.is_recording()
    assert spans.tools() == []


def test_nested_tool_is_a_child_span(agent, spans):
    @agent_otel.tool
    def inner():
        return 1

    @agent_otel.tool
    def outer():
        return inner() + 1

    assert outer() == 2
    (o,) = spans.tools("outer")
    (i,) = spans.tools("inner")
    assert i.parent.span_id == o.context.span_id


def test_arguments_and_results_recorded_only_when_asked(spans):
    agent_otel.instrument(
        traces_exporters="none",
        gpu="off",
        frameworks=(),
        record_arguments=True,
        record_results=True,
        max_attribute_length=60,
        redact=lambda attribute, text: text.replace("secret", "******"),
    )
    try:

        @agent_otel.tool
        def login(user, password):
            return "token-" + "x" * 100

        login("ann", password="secret")
    finally:
        agent_otel.uninstrument()
    a = attrs(spans.tools("login")[0])
    assert a["gen_ai.tool.call.arguments"] == "{'args': ('ann',), 'kwargs': {'password': '******'}}"
    assert a["gen_ai.tool.call.result"] == "token-" + "x" * 54 + "…"  # 60 characters and the ellipsis
