"""A local OpenAI-compatible server that streams scripted answers with engineered delays.

``serve()`` starts it on 127.0.0.1 (a port of its own) for one test; the
real ``openai`` client, and the frameworks' models built on it, talk to it
over HTTP. Each streamed answer (chat completions ``/v1/chat/completions``,
the Responses API ``/v1/responses``) first sends the events that carry no
output (the role-only chunk; ``response.created``, ``in_progress``,
``output_item.added``, ``content_part.added``), then waits until
``FIRST_TOKEN_S`` after the request before the first token (text, or a tool
call's arguments: a chat completions tool call's chunk naming the tool,
with no arguments yet, comes before, at 0.1 s), and ends at ``END_S``: so a client's time to first token is at least ``FIRST_TOKEN_S``,
and a hook that took the first event would read nearly 0.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FIRST_TOKEN_S = 0.15  # when the first token leaves the server, after the request arrived
END_S = 0.3  # when the answer ends
MODEL = "fake-gpt"
USAGE = {"input_tokens": 21, "output_tokens": 3}


@contextmanager
def serve(answer: str = "Hello there", tool_call: tuple[str, str] | None = None):
    """The server's base URL (``http://127.0.0.1:PORT/v1``) while the block runs. Every
    answer is ``answer``, or, with ``tool_call`` ((name, JSON arguments)), a call of that tool."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(answer, tool_call))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fake-openai", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


def _handler(answer: str, tool_call):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet
            pass

        def do_POST(self):
            arrived = time.monotonic()
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
            if not request.get("stream"):
                self.send_error(400, "this fake server only streams")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            pieces = [answer[: len(answer) // 2], answer[len(answer) // 2 :]]
            if self.path.endswith("/responses"):
                events = _responses_events(pieces, tool_call)
            else:
                events = _chat_events(pieces, tool_call, request)
            for when, data in events:
                if when is not None:
                    time.sleep(max(0.0, arrived + when - time.monotonic()))
                self.wfile.write(data.encode())
                self.wfile.flush()
            self.close_connection = True

    return Handler


def _sse(payload: dict, event: str | None = None) -> str:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(payload)}\n\n"


def _chat_events(pieces, tool_call, request):
    """(seconds after the request to send it at, or None: at once; the SSE text) of a chat completions stream."""

    def chunk(delta, finish=None, usage=None):
        choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
        body = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": MODEL, "choices": choices}
        if usage is not None:
            body["usage"] = usage
        return _sse(body)

    events = [(None, chunk({"role": "assistant", "content": ""})), (0.05, chunk({"content": ""}))]
    if tool_call is None:
        events += [(FIRST_TOKEN_S, chunk({"content": pieces[0]})), (0.2, chunk({"content": pieces[1]}))]
        events.append((END_S, chunk({}, "stop")))
    else:
        name, arguments = tool_call
        head = {"index": 0, "id": "call_1", "type": "function", "function": {"name": name, "arguments": ""}}
        events += [
            (0.1, chunk({"tool_calls": [head]})),
            (FIRST_TOKEN_S, chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:5]}}]})),
            (0.2, chunk({"tool_calls": [{"index": 0, "function": {"arguments": arguments[5:]}}]})),
            (END_S, chunk({}, "tool_calls")),
        ]
    if (request.get("stream_options") or {}).get("include_usage"):
        usage = {
            "prompt_tokens": USAGE["input_tokens"],
            "completion_tokens": USAGE["output_tokens"],
            "total_tokens": sum(USAGE.values()),
        }
        events.append((None, chunk(None, usage=usage)))
    events.append((None, "data: [DONE]\n\n"))
    return events


def _responses_events(pieces, tool_call):
    """(when, the SSE text) of a Responses API stream."""
    sequence = iter(range(1000))

    def event(kind, **fields):
        return _sse({"type": kind, "sequence_number": next(sequence), **fields}, kind)

    def response(status, output):
        body = {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "status": status,
            "model": MODEL,
            "output": output,
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "temperature": 1.0,
            "top_p": 1.0,
        }
        if status == "completed":
            body["usage"] = {
                **USAGE,
                "total_tokens": sum(USAGE.values()),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }
        return body

    events = [
        (None, event("response.created", response=response("in_progress", []))),
        (None, event("response.in_progress", response=response("in_progress", []))),
    ]
    if tool_call is None:
        text = "".join(pieces)
        item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "in_progress", "content": []}
        part = {"type": "output_text", "text": "", "annotations": []}
        done = {
            **item,
            "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
        where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
        events += [
            (0.05, event("response.output_item.added", output_index=0, item=item)),
            (None, event("response.content_part.added", part=part, **where)),
            (FIRST_TOKEN_S, event("response.output_text.delta", delta=pieces[0], logprobs=[], **where)),
            (0.2, event("response.output_text.delta", delta=pieces[1], logprobs=[], **where)),
            (None, event("response.output_text.done", text=text, logprobs=[], **where)),
            (None, event("response.content_part.done", part={**part, "text": text}, **where)),
            (None, event("response.output_item.done", output_index=0, item=done)),
        ]
    else:
        name, arguments = tool_call
        item = {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_1",
            "name": name,
            "arguments": "",
            "status": "in_progress",
        }
        done = {**item, "arguments": arguments, "status": "completed"}
        events += [
            (0.05, event("response.output_item.added", output_index=0, item=item)),
            (
                FIRST_TOKEN_S,
                event("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta=arguments[:5]),
            ),
            (0.2, event("response.function_call_arguments.delta", item_id="fc_1", output_index=0, delta=arguments[5:])),
            (None, event("response.function_call_arguments.done", item_id="fc_1", output_index=0, arguments=arguments)),
            (None, event("response.output_item.done", output_index=0, item=done)),
        ]
    events.append((END_S, event("response.completed", response=response("completed", [done]))))
    return events
