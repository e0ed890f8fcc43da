"""A framework hook's model call drives the simulated GPU (docs/gpu.md):
a real LangChain chat model, hooked with no change beyond ``instrument()``."""

from __future__ import annotations

import time

from frameworks.framework_support import require_framework

import agent_otel
from agent_otel.capture.models import model_calls
from agent_otel.support.clock import now_ns
from agent_otel.gpu.logs import read_gpu_log
from agent_otel.records import NS_PER_S

PERIOD_NS = round(NS_PER_S / 6)


def test_a_langchain_model_call_keeps_the_simulated_gpu_busy_while_in_flight(tmp_path, spans):
    require_framework("langchain", "langchain_core")
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult

    class Thinking(BaseChatModel):
        """Answers after 0.6 s of thought."""

        @property
        def _llm_type(self) -> str:
            return "thinking"

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            time.sleep(0.6)
            return ChatResult(generations=[ChatGeneration(message=AIMessage("done"))])

    log = tmp_path / "gpu.csv"
    handle = agent_otel.instrument(
        traces_exporters="none",
        frameworks=["langchain"],
        gpu="simulated",
        gpu_poll_interval=0.05,
        gpu_log_file=str(log),
    )
    try:
        time.sleep(0.5)
        assert Thinking().invoke("hi").content == "done"
        time.sleep(0.5)
    finally:
        handle.shutdown()
    (span,) = spans.models()
    assert model_calls.in_flight_count() == 0
    (series,) = read_gpu_log(str(log)).series.values()
    margin = 2_000_000

    def within(start: int, end: int) -> list[float]:
        return [u for t, u in zip(series.times, series.values) if t - PERIOD_NS >= start + margin and t <= end - margin]

    busy = within(span.start_time, span.end_time)
    idle_after = within(span.end_time, now_ns())
    assert busy and set(busy) == {1.0}, busy
    assert idle_after and set(idle_after) == {0.0}, idle_after
