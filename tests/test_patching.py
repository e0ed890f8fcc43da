"""One way to patch (agent_otel/capture/patching.py), with another instrumentor in the chain.

The other instrumentor is the real opentelemetry-instrumentation-threading,
whose ``ThreadPoolExecutor.submit`` wrapper carries the submitter's
OpenTelemetry context to the worker. Installed before or after
``instrument()``, it must keep doing that, also after agent-otel's
``shutdown()``, and agent-otel's queue time must work while both are there.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.threading import ThreadingInstrumentor

import agent_otel
from agent_otel.capture import executors, patching

UNPATCHED_SUBMIT = vars(ThreadPoolExecutor)["submit"]
tracer = trace.get_tracer("test-patching")
HOLD_S = 0.2


@pytest.fixture
def threading_instrumentor():
    instrumentor = ThreadingInstrumentor()
    yield instrumentor
    if instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.uninstrument()
    agent_otel.uninstrument()
    # An inactive agent-otel wrapper may be left in the chain; instrumenting
    # again reuses it, and shutting down then removes it exactly.
    agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=()).shutdown()
    assert submit() is UNPATCHED_SUBMIT


def submit():
    """ThreadPoolExecutor.submit as the class holds it (a wrapt wrapper binds on attribute access)."""
    return vars(ThreadPoolExecutor)["submit"]


def instrument():
    return agent_otel.instrument(traces_exporters="none", gpu="off", frameworks=())


def chain(attribute) -> list:
    found = []
    while attribute is not None and len(found) < 10:
        found.append(attribute)
        attribute = getattr(attribute, "__wrapped__", None)
    return found


def span_seen_by_a_worker(pool: ThreadPoolExecutor) -> trace.Span:
    """The span current in a worker running a plain function submitted under a new span."""
    with tracer.start_as_current_span("submitter") as parent:
        seen = pool.submit(trace.get_current_span).result(timeout=5)
    assert seen is parent
    return seen


@agent_otel.tool
def lookup(key: str) -> str:
    return key


def queued_tool_span(spans):
    """A tool submitted to a one-worker pool behind a call that holds it: its span."""
    spans.clear()
    release = threading.Event()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="one") as pool:
        with tracer.start_as_current_span("agent turn") as turn:
            pool.submit(release.wait, 5)
            future = pool.submit(lookup, "k")
            time.sleep(HOLD_S)
            release.set()
            assert future.result(timeout=5) == "k"
    (span,) = spans.tools("lookup")
    assert span.parent.span_id == turn.get_span_context().span_id
    return span


def test_their_wrapper_installed_before_instrument_stays_in_the_chain_and_is_put_back(threading_instrumentor, spans):
    threading_instrumentor.instrument()
    theirs = submit()
    assert theirs is not UNPATCHED_SUBMIT

    instrument()
    assert theirs in chain(submit())  # ours calls theirs
    span = queued_tool_span(spans)
    assert span.attributes["agent.tool.queue.duration"] >= HOLD_S * 0.9
    assert span.attributes["agent.tool.executor"] == "one"

    agent_otel.uninstrument()
    assert submit() is theirs  # exactly what was replaced
    with ThreadPoolExecutor(max_workers=1) as pool:
        span_seen_by_a_worker(pool)  # theirs alone carries the context now

    threading_instrumentor.uninstrument()
    assert submit() is UNPATCHED_SUBMIT


def test_their_wrapper_installed_after_instrument_survives_shutdown(threading_instrumentor, spans):
    instrument()
    ours = submit()
    threading_instrumentor.instrument()
    theirs = submit()
    assert chain(theirs)[1] is ours

    # Both active: theirs hands ours a closure of its own, and ours still
    # sees the tool inside it and times its queue.
    span = queued_tool_span(spans)
    assert span.attributes["agent.tool.queue.duration"] >= HOLD_S * 0.9
    assert executors.hooked()

    agent_otel.uninstrument()
    assert submit() is theirs  # not removed with ours
    assert not executors.hooked()
    (left,) = [p for p in patching.in_place() if p.name == "submit"]
    assert not left.active and left.installed is ours
    spans.clear()
    with ThreadPoolExecutor(max_workers=1) as pool:
        span_seen_by_a_worker(pool)  # theirs still carries the context
        assert pool.submit(lookup, "k").result(timeout=5) == "k"
    assert spans.tools() == []  # ours passes through: nothing recorded

    instrument()  # reuses ours, still under theirs: one agent-otel wrapper in the chain
    assert submit() is theirs and chain(theirs)[1] is ours
    assert len([p for p in patching.in_place() if p.name == "submit"]) == 1
    span = queued_tool_span(spans)
    assert span.attributes["agent.tool.queue.duration"] >= HOLD_S * 0.9


# ---------------------------------------------------------------- the undo stack itself


class Library:
    def run(self, x):
        return ("run", x)

    async def arun(self, x):
        return ("arun", x)


def traced(original):
    def run(self, x):
        return ("traced", original(self, x))

    return run


def traced_async(original):
    async def arun(self, x):
        return ("traced", await original(self, x))

    return arun


def on_top(original):
    def run(self, x):
        return ("on top", original(self, x))

    run.__wrapped__ = original
    return run


def test_restore_puts_back_exactly_what_was_replaced():
    before = vars(Library)["run"]
    patches = patching.Patches()
    patches.wrap(Library, "run", traced)
    patches.wrap(Library, "arun", traced_async)
    assert Library().run(1) == ("traced", ("run", 1))
    assert asyncio.run(Library().arun(1)) == ("traced", ("arun", 1))
    assert inspect.iscoroutinefunction(Library.arun)
    assert inspect.signature(Library.run) == inspect.signature(before)
    patches.restore()
    assert vars(Library)["run"] is before and Library().run(1) == ("run", 1)
    assert patching.in_place() == []


def test_a_wrapper_on_top_of_ours_survives_restore_and_ours_passes_through():
    before = vars(Library)["run"]
    patches = patching.Patches()
    patches.wrap(Library, "run", traced)
    Library.run = on_top(vars(Library)["run"])
    patches.restore()
    assert Library().run(1) == ("on top", ("run", 1))  # theirs works; ours is inactive
    again = patching.Patches()
    again.wrap(Library, "run", traced)  # reused under theirs, not wrapped twice
    assert Library().run(1) == ("on top", ("traced", ("run", 1)))
    Library.run = vars(Library)["run"].__wrapped__  # they unwrap
    again.restore()
    assert vars(Library)["run"] is before
    assert patching.in_place() == []


def traced_self_switching(original):
    def run(self, x):
        if run.agent_otel_inactive:
            return original(self, x)
        return ("traced", original(self, x))

    return patching.self_switching(run)


def test_a_self_switching_wrapper_is_installed_as_is_and_passes_through_when_inactive():
    before = vars(Library)["run"]
    patches = patching.Patches()
    patch = patches.wrap(Library, "run", traced_self_switching)
    ours = vars(Library)["run"]
    assert patch.installed is ours and patch.wrapper is ours  # no switch in front
    assert Library().run(1) == ("traced", ("run", 1))
    Library.run = on_top(ours)
    patches.restore()
    assert not patch.active and ours.agent_otel_inactive
    assert Library().run(1) == ("on top", ("run", 1))  # theirs works; ours passes through
    again = patching.Patches()
    assert again.wrap(Library, "run", traced_self_switching) is patch  # reused under theirs
    assert patch.active and not ours.agent_otel_inactive
    assert Library().run(1) == ("on top", ("traced", ("run", 1)))
    Library.run = vars(Library)["run"].__wrapped__  # they unwrap
    again.restore()
    assert vars(Library)["run"] is before and ours.agent_otel_inactive
    assert ours(Library(), 1) == ("run", 1)  # a reference kept to ours passes through, as a switch would
    assert patching.in_place() == []


def test_a_missing_attribute_is_a_version_not_understood():
    with pytest.raises(patching.VersionNotUnderstood, match="Library.walk"):
        patching.Patches().wrap(Library, "walk", traced)


def test_an_inherited_method_is_wrapped_on_the_subclass_and_deleted_again():
    class Child(Library):
        pass

    patches = patching.Patches()
    patches.wrap(Child, "run", traced, inherited=True)
    assert Child().run(1) == ("traced", ("run", 1)) and Library().run(1) == ("run", 1)
    patches.restore()
    assert "run" not in vars(Child) and Child().run(1) == ("run", 1)


def test_wrap_overrides_reaches_subclasses_made_later_and_undoes_them():
    class Base:
        def run(self, x):
            return ("base", x)

    class Early(Base):
        def run(self, x):
            return ("early", x)

    patches = patching.Patches()
    patches.wrap_overrides(Base, "run", traced)

    class Late(Base):
        def run(self, x):
            return ("late", x)

    assert [cls().run(1)[0] for cls in (Base, Early, Late)] == ["traced"] * 3
    patches.restore()
    assert [cls().run(1)[0] for cls in (Base, Early, Late)] == ["base", "early", "late"]
    assert "__init_subclass__" not in vars(Base) and patching.in_place() == []
