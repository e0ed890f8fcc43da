"""The reader's set of spans seen (``spans.decode._SeenSpans``): a span read
twice is found again however the table grew (in Python while small, in
numpy past ``_SEEN_IN_NUMPY`` slots)."""

from __future__ import annotations

import random

import pytest

from agent_otel.spans import decode
from agent_otel.spans.decode import _SeenSpans


def _keys(kind: str, count: int) -> list[int]:
    rng = random.Random(7)
    if kind == "random":  # trace id << 64 | span id, as exporters make them
        return [rng.getrandbits(128) for _ in range(count)]
    if kind == "one trace":  # one trace, span ids counted up: long runs of taken slots
        return [(0xABC << 64) | i for i in range(1, count + 1)]
    # many traces with the same few span ids
    return [(trace << 64) | span for trace in range(1, count // 4 + 1) for span in (1, 2, 3, 4)]


@pytest.mark.parametrize("kind", ["random", "one trace", "traces alike"])
def test_every_span_is_new_once_and_seen_after_every_growth(kind):
    keys = _keys(kind, 40_000)  # grows past _SEEN_IN_NUMPY slots several times
    assert len(keys) > 4 * decode._SEEN_IN_NUMPY
    seen = _SeenSpans()
    for i, key in enumerate(keys):
        assert seen.add(key), f"span {i} taken for one seen before"
        if i % 997 == 0:  # the spans before are found at every size of the table
            assert not any(seen.add(old) for old in keys[: i + 1 : 13])
    assert not any(seen.add(key) for key in keys)
    assert seen._count == len(keys)


def test_growing_in_numpy_keeps_what_growing_in_python_keeps(monkeypatch):
    keys = _keys("random", 20_000)
    in_numpy = _SeenSpans()
    for key in keys:
        in_numpy.add(key)
    monkeypatch.setattr(decode, "_SEEN_IN_NUMPY", 1 << 62)
    in_python = _SeenSpans()
    for key in keys:
        in_python.add(key)
    assert len(in_numpy._table) == len(in_python._table)
    assert sorted(in_numpy._table) == sorted(in_python._table)
