"""The package's public face: lazy, typed, one version."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import textwrap

import pytest

import agent_otel


def run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_public_names_resolve_to_what_they_name():
    from agent_otel.wiring.instrumentation import Instrumentation, instrument, uninstrument
    from agent_otel.tools import tool, tool_span

    assert agent_otel.instrument is instrument and agent_otel.uninstrument is uninstrument
    assert agent_otel.Instrumentation is Instrumentation
    assert agent_otel.tool is tool and agent_otel.tool_span is tool_span
    assert set(agent_otel.__all__) == set(agent_otel._PUBLIC) | {"__version__"}
    assert set(agent_otel.__all__) <= set(dir(agent_otel))
    for name in agent_otel.__all__:
        assert getattr(agent_otel, name) is not None, name
    with pytest.raises(AttributeError, match="no_such_name"):
        agent_otel.no_such_name  # noqa: B018


def test_the_remedies_names_resolve_to_what_they_name():
    import agent_otel.remedies as remedies
    from agent_otel.remedies import batching, cache, pools

    assert set(remedies.__all__) == set(remedies._PUBLIC)
    assert set(remedies.__all__) <= set(dir(remedies))
    assert remedies.pools is pools and remedies.pool is pools.pool and remedies.ToolPool is pools.ToolPool
    assert remedies.batch is batching.batch and remedies.MISS is cache.MISS
    with pytest.raises(AttributeError, match="no_such_name"):
        remedies.no_such_name  # noqa: B018


def test_instrument_stays_the_function_whichever_module_is_imported_first():
    # Importing the module that defines instrument() (as the framework entry
    # points and the demo do) must not shadow the function on the package.
    assert (
        run("""
        import agent_otel.wiring.instrumentation, agent_otel
        print(callable(agent_otel.instrument), agent_otel.instrument.__module__)
    """)
        == "True agent_otel.wiring.instrumentation"
    )


def test_importing_the_package_loads_nothing_heavy_until_a_name_is_used():
    assert (
        run("""
        import sys, agent_otel
        print(sorted(m for m in sys.modules if m.startswith(("opentelemetry", "prometheus_client", "agent_otel."))))
        agent_otel.instrument
        print("opentelemetry.sdk.trace" in sys.modules)
    """)
        == "['agent_otel.version']\nTrue"
    )


def test_one_version_for_the_package_its_metadata_and_its_spans(agent, spans):
    from agent_otel.version import __version__

    assert agent_otel.__version__ == __version__ == importlib.metadata.version("agent-otel")

    @agent_otel.tool
    def lookup() -> int:
        return 1

    lookup()
    (span,) = spans.tools("lookup")
    assert span.instrumentation_scope.name == "agent_otel"
    assert span.instrumentation_scope.version == __version__
