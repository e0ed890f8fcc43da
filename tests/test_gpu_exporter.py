"""agent-otel gpu-exporter as an operator runs it on a GPU host."""

import json
import os
import re
import subprocess
import sys
import time
import urllib.request


def test_gpu_exporter_serves_metrics_and_writes_idle_spans(tmp_path):
    traces = tmp_path / "gpu.jsonl"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    env.update({"OTEL_TRACES_EXPORTER": "none", "PYTHONUNBUFFERED": "1"})
    process = subprocess.Popen(
        [sys.executable, "-m", "agent_otel.cli", "gpu-exporter", "--gpu", "simulated", "--prometheus-port", "0",
         "--poll-interval", "0.05", "--min-idle", "0.2", "--traces-file", str(traces), "--duration", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = process.stdout.readline()
        assert "sampling 1 GPU(s) via simulated: 0 Simulated GPU" in first
        url = re.search(r"metrics at (\S+)", process.stdout.readline()).group(1)
        assert url.startswith("http://127.0.0.1:")
        time.sleep(0.5)
        text = urllib.request.urlopen(url, timeout=5).read().decode()
        assert 'agent_gpu_utilization_ratio{gpu="0"} 0.0' in text
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    spans = [span for line in traces.read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"] for span in ss["spans"]]
    (idle,) = [s for s in spans if s["name"] == "gpu.idle"]
    attributes = {a["key"]: a["value"] for a in idle["attributes"]}
    # The simulated GPU was never given work: one window, the whole run.
    assert 3.0 < attributes["gpu.idle.duration"]["doubleValue"] < 5.0
    assert attributes["gpu.idle.unattributed_duration"]["doubleValue"] == attributes["gpu.idle.duration"]["doubleValue"]
    assert "gpu.idle.blocked_by" not in attributes
