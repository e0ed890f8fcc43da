"""The report page's model-server sections (the server's split of the model
calls, the KV cache held per tool, what idle costs) in real headless
Chromium at 800 px: present, without console errors, and nothing wider
than the window."""

from __future__ import annotations

import pytest

from agent_otel.commands.cli import main
from helpers.browser import Elements, chromium, console_messages
from helpers.traces import RecordedRun, ns
from helpers.server_traces import ServerTraces, headers_of, kv_window

MEASURE = """<script>
document.documentElement.dataset.scrollWidth = String(document.documentElement.scrollWidth);
document.documentElement.dataset.viewport = String(window.innerWidth);
</script>"""


def test_the_sections_render_in_chromium_within_the_window(tmp_path):
    run = RecordedRun(tmp_path / "agent.jsonl", service="support-agent")
    server = ServerTraces(tmp_path / "vllm.jsonl")
    run.agent_run(0.0, 8.0)
    call = run.model_call("a-model-with-a-rather-long-name-70b-instruct", 0.2, 0.9)
    server.request(headers_of(call), ns(0.25), ns(0.85), queue=0.1, ttft=0.3, prefill=0.2, decode=0.25, e2e=0.6)
    run.tool_call("embed_documents_with_a_long_tool_name", 1.0, 1.0, 4.0, executor="direct")
    run.tool_call("search", 3.0, 3.0, 7.5, executor="direct")
    kv_window(run, 2.0, 5.0, 0.6)
    kv_window(run, 6.0, 7.0, 0.2)
    run.close()
    page = tmp_path / "report.html"
    argv = ["report", str(tmp_path / "agent.jsonl"), str(tmp_path / "vllm.jsonl"), "--gpu-hour-price", "3"]
    assert main([*argv, "--html", str(page), "--format", "json"]) == 0
    played = tmp_path / "played.html"
    played.write_text(page.read_text().replace("</body>", MEASURE + "</body>", 1))
    result = chromium(tmp_path, played.as_uri(), "--dump-dom", width=800, height=1000)
    assert result.returncode == 0, result.stderr[-2000:]
    assert console_messages(result) == []
    elements = Elements(result.stdout)
    ids = {element["attrs"].get("id") for element in elements.found}
    assert {"model-server-table", "kv-cache-table", "cost-table"} <= ids
    (root,) = elements.where(tag="html")
    assert int(root["attrs"]["data-scroll-width"]) <= int(root["attrs"]["data-viewport"]) == 800


CLIPPED = """<script>
(function () {
  var clipped = [];
  document.querySelectorAll("section table").forEach(function (table) {
    var section = table.closest("section");
    if (section.scrollWidth > section.clientWidth + 1 || table.getBoundingClientRect().right > window.innerWidth + 1) {
      clipped.push(table.id + ":" + section.scrollWidth + ">" + section.clientWidth);
    }
  });
  document.documentElement.dataset.clipped = clipped.join(" ");
  document.documentElement.dataset.tables = String(document.querySelectorAll("section table").length);
})();
</script>"""


@pytest.mark.parametrize("width", [1280, 1400])
def test_from_1280_px_no_table_of_the_page_is_clipped(tmp_path, width):
    run = RecordedRun(tmp_path / "agent.jsonl", service="support-agent")
    server = ServerTraces(tmp_path / "vllm.jsonl")
    run.agent_run(0.0, 8.0)
    call = run.model_call("a-model-with-a-rather-long-name-70b-instruct", 0.2, 0.9)
    server.request(headers_of(call), ns(0.25), ns(0.85), queue=0.1, ttft=0.3, prefill=0.2, decode=0.25, e2e=0.6)
    run.tool_call("embed_documents_with_a_long_tool_name", 1.0, 1.0, 4.0, executor="direct", cpu=2.5)
    run.tool_call("search", 3.0, 3.0, 7.5, executor="io", workers=4)
    kv_window(run, 2.0, 5.0, 0.6)
    kv_window(run, 6.0, 7.0, 0.2)
    run.close()
    page = tmp_path / "report.html"
    argv = ["report", str(tmp_path / "agent.jsonl"), str(tmp_path / "vllm.jsonl"), "--gpu-hour-price", "3"]
    assert main([*argv, "--html", str(page), "--format", "json"]) == 0
    played = tmp_path / "played.html"
    played.write_text(page.read_text().replace("</body>", CLIPPED + "</body>", 1))
    result = chromium(tmp_path, played.as_uri(), "--dump-dom", width=width, height=900)
    assert result.returncode == 0, result.stderr[-2000:]
    (root,) = Elements(result.stdout).where(tag="html")
    assert int(root["attrs"]["data-tables"]) >= 7
    assert root["attrs"]["data-clipped"] == ""
