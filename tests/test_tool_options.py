"""@agent_otel.tool's remedy options: declared once (agent_otel/remedies/options.py),
and the signature, the typed overload, the checks and the docs' table derived from it."""

from __future__ import annotations

import ast
import re
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import agent_otel
from agent_otel.remedies import options
from agent_otel.remedies.options import REMEDY_OPTIONS

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "remedies.md"


def test_the_signature_is_the_one_it_always_had():
    assert str(inspect.signature(agent_otel.tool)) == (
        "(fn=None, *, name=None, description=None, tool_type='function', "
        "pool=None, timeout=None, retries=0, retry_interval=0.1, fallback=None, cache=None)"
    )


def test_the_typed_overload_is_the_declaration():
    # Type checkers read the overload in tools.py: its remedy keywords, in
    # order and with their defaults, are the declaration's.
    tree = ast.parse((REPO / "agent_otel" / "tools.py").read_text())
    overloads = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and node.name == "tool"
        and any(isinstance(d, ast.Name) and d.id == "overload" for d in node.decorator_list)
    ]
    keywords = overloads[-1].args
    declared = [(arg.arg, ast.unparse(default)) for arg, default in zip(keywords.kwonlyargs, keywords.kw_defaults)]
    assert declared[:3] == [("name", "None"), ("description", "None"), ("tool_type", "TOOL_TYPE_FUNCTION")]
    assert declared[3:] == [(option.name, repr(option.default)) for option in REMEDY_OPTIONS]


def test_the_docs_table_is_the_declaration():
    text = DOCS.read_text()
    assert options.docs_with_table(text) == text, "run: python -m agent_otel.remedies.options --write docs/remedies.md"
    for option in REMEDY_OPTIONS:
        assert f"| `{option.name}` | `{option.default!r}` | {option.accepts} |" in text


def test_the_check_command_fails_on_a_stale_table(tmp_path):
    stale = tmp_path / "remedies.md"
    stale.write_text(DOCS.read_text().replace("a whole number >= 0", "a number"))
    command = [sys.executable, "-m", "agent_otel.remedies.options"]
    assert subprocess.run([*command, "--check", str(DOCS)], capture_output=True).returncode == 0
    failed = subprocess.run([*command, "--check", str(stale)], capture_output=True, text=True)
    assert failed.returncode == 1 and "stale" in failed.stderr
    subprocess.run([*command, "--write", str(stale)], check=True)
    assert stale.read_text() == DOCS.read_text()


INVALID = {"pool": "  ", "timeout": 0, "retries": -1, "retry_interval": -0.5, "fallback": "cached", "cache": "yes"}


@pytest.mark.parametrize("option", REMEDY_OPTIONS, ids=lambda option: option.name)
def test_each_option_is_checked_with_the_message_its_declaration_gives(option):
    values = {option.name: INVALID[option.name]}
    if option.off is None:  # it tunes another remedy: checked where one is on
        values["retries"] = 1
    with pytest.raises(
        agent_otel.ConfigError, match=re.escape(f"@tool 'search' {option.name}: expected {option.accepts}")
    ):

        @agent_otel.tool(**values)
        def search(query):
            return query


def test_an_unknown_option_is_the_type_error_it_always_was():
    with pytest.raises(TypeError, match="unexpected keyword argument 'timout'"):
        agent_otel.tool(timout=1.0)


def test_a_result_cache_alone_makes_the_tool_cache():
    # cache's off values are None and False: any ResultCache switches it on.
    calls = []

    @agent_otel.tool(cache=agent_otel.ResultCache(ttl=30))
    def rate(currency: str) -> float:
        calls.append(currency)
        return 1.1

    assert rate("EUR") == rate("EUR") == 1.1
    assert calls == ["EUR"]


@pytest.mark.parametrize(
    "values, remedied",
    [
        ({}, False),
        ({"retries": 0, "cache": False, "retry_interval": 0.5}, False),
        ({"retries": 1}, True),
        ({"cache": True}, True),
        ({"fallback": lambda x: x}, True),
        ({"timeout": 1.0}, True),
    ],
)
def test_the_remedy_wrapper_only_where_an_option_switches_a_remedy_on(values, remedied):
    @agent_otel.tool(**values)
    def tool_fn(x):
        return x

    assert hasattr(tool_fn, "aio") is remedied  # a sync tool's remedy wrapper has .aio; the plain one not
    assert tool_fn(3) == 3
