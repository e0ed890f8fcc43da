"""The demo agent: several conversations sharing one GPU, served two ways.

Each conversation alternates model steps and tool calls: the model (on the
GPU) asks for a tool, the tool answers, the model reads the answer and asks
for the next one. What differs is how the serving code waits. Both end on
a model step, so neither run ends with the GPU waiting for a tool.

``serve_baseline`` is the loop as commonly written, in asyncio: one batched
model step for every conversation, then the tool calls of all of them
(``asyncio.gather``) on one shared two-worker pool, and the next step only
when the slowest call is back. The sync CRM client is called straight from
the coroutine, so it blocks the event loop: the other conversations' calls
are not even sent until it returns. The GPU idles while calls queue for the
two workers, wait on the slow API, or wait for the loop.

``serve_fixed`` gives each conversation its own coroutine and batches the
model continuously: whichever conversations are waiting for the model ride
the next step, so the GPU serves the others while one waits for a tool.
Tools run on a pool of their own class (the sync CRM client too, awaited
with ``.aio()``: the loop stays free), and the slow API is bounded by a
timeout, one retry and a fallback (``tools.fixed_tools``).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from agent_otel.capture.models import agent_span, model_span
from agent_otel.demo.tools import BASELINE_POOL_WORKERS, Services, Toolset

MODEL_NAME = "demo-llm"
BASELINE_TURN = "round"  # the baseline's turn: one lock-step round of every conversation
FIXED_TURN = "conversation"  # the fixed run's: one conversation's model call and tool call
MODEL_STEP_BASE_S = 0.15
MODEL_STEP_PER_CONVERSATION_S = 0.03


class Model:
    """A stand-in LLM: one decode step for a batch keeps the GPU busy for a
    fixed cost plus a little per conversation in the batch.

    The serving code records the model calls (``agent_otel.model_span``,
    ``chat demo-llm``) and the agent turns (``agent_otel.agent_span``), so
    the traces, the report's timeline and its turn breakdown show the
    model's work next to the tools'.
    """

    def __init__(self, run_kernel: Callable[[float], None]):
        self.run_kernel = run_kernel

    def step(self, batch: int) -> None:
        self.run_kernel(MODEL_STEP_BASE_S + MODEL_STEP_PER_CONVERSATION_S * batch)


def serve_baseline(
    model: Model, tools: Toolset, services: Services, conversations: int, done: Callable[[], bool]
) -> None:
    """Serve every conversation in lock step until ``done()``.

    One agent turn (``invoke_agent round``) is one round: the batched model
    step, then every conversation's tool call, then the wait for the slowest.
    """
    asyncio.run(_serve_baseline(model, tools, services, conversations, done))


async def _serve_baseline(
    model: Model, tools: Toolset, services: Services, conversations: int, done: Callable[[], bool]
) -> None:
    loop = asyncio.get_running_loop()
    with (
        ThreadPoolExecutor(max_workers=BASELINE_POOL_WORKERS, thread_name_prefix="agent-tools") as pool,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="model") as gpu_thread,
    ):
        number = 0
        while True:
            with agent_span(BASELINE_TURN):
                async with model_span(MODEL_NAME):
                    await loop.run_in_executor(gpu_thread, model.step, conversations)
                if done():
                    break
                turns = [services.turn(conversation, number) for conversation in range(conversations)]
                # The GPU idles until the slowest call is back. (A real agent would
                # hand each answer, or error, to the model; the demo moves on.)
                await asyncio.gather(
                    *(_baseline_call(loop, pool, tools, turn) for turn in turns), return_exceptions=True
                )
            number += 1


async def _baseline_call(loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor, tools: Toolset, turn):
    if turn.tool == "lookup_account":
        # A sync client called from async code, as it is so often written: it
        # holds the event loop (and every other conversation) until it returns.
        return tools.lookup_account(turn.argument, turn.request_id)
    return await loop.run_in_executor(pool, tools[turn.tool], turn.argument, turn.request_id)


def serve_fixed(model: Model, tools: Toolset, services: Services, conversations: int, done: Callable[[], bool]) -> None:
    """Serve every conversation on its own until ``done()``."""
    asyncio.run(_serve_fixed(model, tools, services, conversations, done))


async def _serve_fixed(
    model: Model, tools: Toolset, services: Services, conversations: int, done: Callable[[], bool]
) -> None:
    batcher = ContinuousBatcher(model)
    serving = asyncio.create_task(batcher.serve())
    try:
        await asyncio.gather(*(_converse(c, batcher, tools, services, done) for c in range(conversations)))
    finally:
        batcher.close()
        await serving


async def _converse(
    conversation: int, batcher: "ContinuousBatcher", tools: Toolset, services: Services, done: Callable[[], bool]
) -> None:
    """One conversation; each of its turns (``invoke_agent conversation``) is
    its model call (the wait for a batched step and the step itself) and its
    tool call."""
    number = 0
    while True:
        with agent_span(FIXED_TURN):
            async with model_span(MODEL_NAME):
                await batcher.generate()
            if done():
                break
            turn = services.turn(conversation, number)
            try:
                if turn.tool == "calculator":
                    tools.calculator(turn.argument, turn.request_id)  # milliseconds: inline is fine
                else:  # on the tool's pool, awaited: the event loop stays free (the sync CRM client too)
                    await tools[turn.tool].aio(turn.argument, turn.request_id)
            except Exception:
                pass  # a real agent hands the error to the model as the tool's answer; the demo moves on
        number += 1


class ContinuousBatcher:
    """Continuous batching: every conversation waiting for the model rides the next step."""

    def __init__(self, model: Model):
        self.model = model
        self.waiting: list[asyncio.Future] = []
        self.wake = asyncio.Event()
        self.closed = False
        self.gpu_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="model")

    async def generate(self) -> None:
        """Wait for one model step that includes this conversation."""
        answer = asyncio.get_running_loop().create_future()
        self.waiting.append(answer)
        self.wake.set()
        await answer

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while not self.closed:
                await self.wake.wait()
                self.wake.clear()
                batch, self.waiting = self.waiting, []
                if batch:
                    await loop.run_in_executor(self.gpu_thread, self.model.step, len(batch))
                for answer in batch:
                    if not answer.done():  # a conversation cancelled meanwhile
                        answer.set_result(None)
        finally:
            self.gpu_thread.shutdown()

    def close(self) -> None:
        self.closed = True
        self.wake.set()
