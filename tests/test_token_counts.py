"""A model span's token counts (``SpanReader._count``): read inline where
they are a decimal ``intValue`` alone, as exporters write them, and the
same as ``value_of`` reads them in every other form."""

from __future__ import annotations

import json
from typing import Optional

import msgspec
import pytest

from agent_otel.spans.decode import SpanReader
from agent_otel.spans.otlp_json import JsonSpan, SpanFormatError


def _read(value: dict) -> Optional[int]:
    span = {
        "traceId": "0af7651916cd43dd8448eb211c80319c",
        "spanId": "b7ad6b7169203331",
        "name": "chat m",
        "startTimeUnixNano": "1772442000000000000",
        "endTimeUnixNano": "1772442000100000000",
        "attributes": [
            {"key": "gen_ai.operation.name", "value": {"stringValue": "chat"}},
            {"key": "gen_ai.request.model", "value": {"stringValue": "m"}},
            {"key": "gen_ai.usage.input_tokens", "value": value},
        ],
    }
    reader = SpanReader()
    reader.add(msgspec.json.decode(json.dumps(span), type=JsonSpan), 1)
    (call,) = reader.data.model_calls
    return call.input_tokens


@pytest.mark.parametrize(
    "value, tokens",
    [
        ({"intValue": "3922"}, 3922),
        ({"intValue": "0042"}, 42),
        ({"intValue": 3922}, 3922),
        ({"doubleValue": 12.0}, 12),
        ({"intValue": "999999999999999"}, 999_999_999_999_999),  # 15 digits: the last read inline
        ({}, None),  # an empty value: no count
    ],
)
def test_a_token_count_is_read_in_any_form_exporters_write(value, tokens):
    assert _read(value) == tokens


@pytest.mark.parametrize(
    "value, reason",
    [
        ({"intValue": "1000000000000000"}, "out_of_range"),  # 1e15
        ({"intValue": "-1"}, "out_of_range"),
        ({"stringValue": "12", "intValue": "12"}, "wrong_type"),  # the string value comes first
        ({"boolValue": True, "intValue": "12"}, "wrong_type"),
    ],
)
def test_a_token_count_out_of_range_or_of_another_type_refuses_the_span(value, reason):
    with pytest.raises(SpanFormatError) as refused:
        _read(value)
    assert refused.value.reason == reason
    assert "gen_ai.usage.input_tokens is not a token count" in str(refused.value)
