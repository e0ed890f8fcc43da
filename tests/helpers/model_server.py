"""A stand-in model server on 127.0.0.1: its /metrics, written from each
engine's documented metric families, and whatever the test makes it do
(answer slowly, fail, vanish, restart with its counters at zero).

The expositions follow what each engine documents:
- vLLM: docs/design/metrics.md and vllm/v1/metrics/loggers.py (V1:
  ``vllm:kv_cache_usage_perc``; before V1, ``vllm:gpu_cache_usage_perc``),
  labels ``model_name`` and, since V1, ``engine``;
- SGLang: docs/references/production_metrics.md and
  python/sglang/srt/metrics/collector.py (``sglang:num_running_reqs``,
  ``sglang:num_queue_reqs``, ``sglang:token_usage``);
- TGI: docs/source/reference/metrics.md (``tgi_batch_current_size``,
  ``tgi_queue_size``, ``tgi_batch_inference_count`` per ``method``, a
  counter its Rust exporter writes without ``_total``).
"""

from __future__ import annotations

import http.server
import threading
import time
from typing import Optional

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def vllm_v1(running: float, waiting: float, kv: float, prompt: float, generation: float, engines: int = 1) -> str:
    lines = []
    for name, kind, help_text, value in (
        ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", running),
        ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", waiting),
        ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", kv),
        ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", prompt),
        ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", generation),
    ):
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        for engine in range(engines):
            # Data parallel: one series per engine; the counts add up, the usage is each engine's.
            share = value / engines if kind == "counter" or "num_requests" in name else value
            lines.append(f'{name}{{engine="{engine}",model_name="{MODEL}"}} {share}')
    lines += [
        "# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.",
        "# TYPE vllm:e2e_request_latency_seconds histogram",
        f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="1.0",model_name="{MODEL}"}} 3.0',
        f'vllm:e2e_request_latency_seconds_bucket{{engine="0",le="+Inf",model_name="{MODEL}"}} 4.0',
        f'vllm:e2e_request_latency_seconds_count{{engine="0",model_name="{MODEL}"}} 4.0',
        f'vllm:e2e_request_latency_seconds_sum{{engine="0",model_name="{MODEL}"}} 3.5',
    ]
    return "\n".join(lines) + "\n"


def vllm_v0(running: float, waiting: float, kv: float, prompt: float, generation: float) -> str:
    lines = []
    for name, kind, value in (
        ("vllm:num_requests_running", "gauge", running),
        ("vllm:num_requests_swapped", "gauge", 0.0),
        ("vllm:num_requests_waiting", "gauge", waiting),
        ("vllm:gpu_cache_usage_perc", "gauge", kv),
        ("vllm:cpu_cache_usage_perc", "gauge", 0.0),
        ("vllm:prompt_tokens_total", "counter", prompt),
        ("vllm:generation_tokens_total", "counter", generation),
    ):
        lines += [f"# HELP {name} {name}", f"# TYPE {name} {kind}", f'{name}{{model_name="{MODEL}"}} {value}']
    return "\n".join(lines) + "\n"


def sglang(running: float, waiting: float, token_usage: float, prompt: float, generation: float) -> str:
    lines = []
    for name, kind, value in (
        ("sglang:prompt_tokens_total", "counter", prompt),
        ("sglang:generation_tokens_total", "counter", generation),
        ("sglang:num_running_reqs", "gauge", running),
        ("sglang:num_used_tokens", "gauge", 1000.0),
        ("sglang:token_usage", "gauge", token_usage),
        ("sglang:gen_throughput", "gauge", 80.5),
        ("sglang:num_queue_reqs", "gauge", waiting),
        ("sglang:cache_hit_rate", "gauge", 0.0075),
    ):
        lines += [
            f"# HELP {name} {name}",
            f"# TYPE {name} {kind}",
            f'{name}{{model_name="{MODEL}",tp_rank="0",pp_rank="0"}} {value}',
        ]
    return "\n".join(lines) + "\n"


def tgi(running: float, waiting: float, prefills: float, decodes: float) -> str:
    return (
        "# TYPE tgi_batch_current_size gauge\n"
        f"tgi_batch_current_size {running}\n"
        "# TYPE tgi_queue_size gauge\n"
        f"tgi_queue_size {waiting}\n"
        "# TYPE tgi_batch_current_max_tokens gauge\n"
        "tgi_batch_current_max_tokens 4096\n"
        "# TYPE tgi_batch_inference_count counter\n"
        f'tgi_batch_inference_count{{method="prefill"}} {prefills}\n'
        f'tgi_batch_inference_count{{method="decode"}} {decodes}\n'
        "# TYPE tgi_request_count counter\n"
        "tgi_request_count 12\n"
    )


class _Handler(http.server.BaseHTTPRequestHandler):
    server: "_Server"

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        owner = self.server.owner
        owner.requests.append((self.path, dict(self.headers)))
        if owner.delay_s:
            time.sleep(owner.delay_s)
        body = owner.body.encode()
        self.send_response(owner.status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802 (the stdlib's name): an OpenAI-style completion, for traceparent tests
        owner = self.server.owner
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        owner.requests.append((self.path, dict(self.headers)))
        body = owner.post_body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    owner: "FakeModelServer"


class FakeModelServer:
    """Serves ``body`` on every GET (``/metrics``), on 127.0.0.1; ``stop()``
    makes it vanish, ``start()`` brings it back on the same port."""

    def __init__(self, body: str = ""):
        self.body = body
        self.post_body = '{"choices": [{"message": {"role": "assistant", "content": "ok"}}]}'
        self.status = 200
        self.delay_s = 0.0
        self.requests: list[tuple[str, dict]] = []
        self.port = 0
        self._httpd: Optional[_Server] = None
        self._thread: Optional[threading.Thread] = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/metrics"

    def start(self) -> None:
        httpd = _Server(("127.0.0.1", self.port), _Handler)
        httpd.owner = self
        self.port = httpd.server_address[1]
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
