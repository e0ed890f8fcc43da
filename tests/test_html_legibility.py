"""The HTML timeline says what it shows: the run's name, a simulated GPU
as simulated, every colour in its legend, a utilization axis, and a layout
that keeps the timeline usable at 800 px. Checked in real headless
Chromium, with screenshots at 800 and 1400 px."""

from __future__ import annotations

import re
import struct
from datetime import datetime, timezone
from pathlib import Path

import pytest

from agent_otel.commands.cli import main
from agent_otel.gpu.logs import GpuLogWriter, read_gpu_log
from agent_otel.gpu.simulated import SimulatedGpu
from agent_otel.records import GpuSample
from agent_otel.report import html as report_html
from helpers.browser import Elements, chromium, console_messages
from helpers.traces import T0, T0_NS, RecordedRun, write_gpu_csv

REPORT_DIR = Path(report_html.__file__).parent


def record_run(tmp_path: Path, *, simulated: bool) -> Path:
    """A 9 s run of research-agent whose GPU log was written by the live
    path's writer from a simulated GPU (or a real-looking one)."""
    run = RecordedRun(tmp_path / "research.jsonl", service="research-agent")
    run.agent_run(0.0, 9.0)
    run.model_call("llama-3-70b", 2.2, 2.9, input_tokens=800, output_tokens=40)  # the GPU idles meanwhile
    embed = run.tool_call("embed", 1.0, 1.0, 4.0, executor="direct", cpu=2.7)
    search = run.tool_call("search", 3.0, 3.5, 4.5, executor="io", workers=4)
    run.tool_call("render", 6.0, 6.0, 6.5, executor="direct", outcome="error")
    # embed, called from a coroutine, held the event loop while search waited
    run.loop_block(3.2, 4.0, blocker=embed, waiting=[search])
    run.loop_block(7.0, 7.6)  # and code that is no tool
    run.close()
    device = SimulatedGpu().devices() if simulated else []
    writer = GpuLogWriter(str(tmp_path / "gpu.csv"), device)
    # The writer writes local time: the test reads it back in the local zone (no --tz).
    writer.write([GpuSample("0", T0_NS + k * 100_000_000, 0.03 if 20 < k <= 50 else 0.85) for k in range(90)])
    writer.close()
    page = tmp_path / "report.html"
    assert (
        main(
            [
                "report",
                str(tmp_path / "research.jsonl"),
                "--gpu-log",
                str(tmp_path / "gpu.csv"),
                "--html",
                str(page),
                "--format",
                "json",
            ]
        )
        == 0
    )
    return page


def test_the_live_gpu_log_carries_name_and_uuid_and_reads_back(tmp_path):
    path = tmp_path / "gpu.csv"
    writer = GpuLogWriter(str(path), SimulatedGpu(devices=["0", "1"]).devices())
    writer.write([GpuSample(str(gpu), T0_NS + k * 200_000_000, 0.5) for k in range(3) for gpu in (0, 1)])
    writer.close()
    lines = path.read_text().splitlines()
    assert lines[0] == "timestamp, index, name, uuid, utilization.gpu [%]"
    assert lines[1].endswith(", 0, Simulated GPU, GPU-simulated-0, 50 %")
    log = read_gpu_log(str(path))
    assert log.names == {"0": "Simulated GPU", "1": "Simulated GPU"}
    assert log.uuids == {"0": "GPU-simulated-0", "1": "GPU-simulated-1"}
    assert len(log) == 6


def test_the_title_and_header_name_the_run_and_a_simulated_gpu(tmp_path):
    page = record_run(tmp_path, simulated=True)
    dom = Elements(page.read_text())
    (title,) = dom.where(tag="title")
    (h1,) = dom.where(tag="h1")
    when = f"{T0:%Y-%m-%d %H:%M:%S} to {datetime.fromtimestamp(T0.timestamp() + 9, timezone.utc):%H:%M:%S} UTC (9.0 s)"
    assert h1["text"] == "agent-otel report: research-agent, research.jsonl"
    assert title["text"] == f"agent-otel report: research-agent, research.jsonl · {when}"
    (summary,) = dom.where(tag="p", **{"class": "summary"})
    assert when in summary["text"]
    assert summary["text"].startswith("simulated GPU")  # the badge first
    assert "simulated GPU 0: not a real GPU" in summary["text"]
    gpu_rows = [e for e in dom.found if e["tag"] == "tr" and "simulated" in e["text"]]
    assert gpu_rows and gpu_rows[0]["text"].startswith("0 simulated")  # the GPUs table


def test_a_real_gpu_is_never_called_simulated(tmp_path):
    page = record_run(tmp_path, simulated=False)
    text = page.read_text()
    shown = re.sub(r"<(style|script)[^>]*>.*?</\1>", "", text, flags=re.S)
    assert "simulated" not in shown.lower()
    assert '"simulated":false' in text and '"simulated":true' not in text


def test_gpu_idle_spans_of_a_simulated_gpu_say_so(tmp_path):
    run = RecordedRun(tmp_path / "t.jsonl")
    run.agent_run(0.0, 5.0)
    run.tool_call("embed", 1.0, 1.0, 3.0, executor="direct")
    run.idle_window(0, 1.0, 3.0, source="simulated")
    run.idle_window(1, 1.0, 3.0, source="nvml")
    run.close()
    out = tmp_path / "t.html"
    assert main(["report", str(tmp_path / "t.jsonl"), "--html", str(out), "--format", "json"]) == 0
    text = out.read_text()
    assert '"gpu":"0","simulated":true' in text and '"gpu":"1","simulated":false' in text


# ---------------------------------------------------------------- the legend holds every colour


def swatch_colours(style: str) -> dict[str, set[str]]:
    """Legend swatch (``.sw.NAME``) -> the ``--c-*`` variables its CSS rules use."""
    found: dict[str, set[str]] = {}
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", style):
        for selector in selectors.split(","):
            match = re.fullmatch(r"\s*\.sw\.([a-z-]+)\s*", selector)
            if match:
                found.setdefault(match.group(1), set()).update(re.findall(r"var\((--c-[a-z-]+)\)", body))
    return found


def test_every_data_colour_of_the_timeline_has_a_legend_swatch():
    script = (REPORT_DIR / "timeline.js").read_text()
    style = (REPORT_DIR / "timeline.css").read_text()
    # the script draws only with colours it reads from the stylesheet
    assert not re.search(r"#[0-9a-fA-F]{3,8}\b|rgba?\(", script)
    used = set(re.findall(r'css\("(--c-[a-z-]+)"\)', script))
    assert {"--c-queue", "--c-exec", "--c-blamed", "--c-idle", "--c-util", "--c-unused", "--c-model"} <= used
    swatches = swatch_colours(style)
    legend = {name for name, _ in report_html.LEGEND}
    assert legend <= set(swatches), legend - set(swatches)
    in_legend = set().union(*(swatches[name] for name in legend))
    assert used <= in_legend, used - in_legend
    defined = set(re.findall(r"(--c-[a-z-]+):", style))
    assert defined == used  # no colour defined for the canvas and left unused


# Injected before the page's own script: records every colour the canvas
# is told to draw with and every text it writes.
HOOK = """<script>
(function () {
  var proto = CanvasRenderingContext2D.prototype;
  window.__colours = new Set();
  window.__texts = [];
  ["fillStyle", "strokeStyle"].forEach(function (name) {
    var desc = Object.getOwnPropertyDescriptor(proto, name);
    Object.defineProperty(proto, name, {
      get: desc.get,
      set: function (value) { desc.set.call(this, value); window.__colours.add(desc.get.call(this)); },
      configurable: true
    });
  });
  var fillText = proto.fillText;
  proto.fillText = function (text) { window.__texts.push(String(text)); return fillText.apply(this, arguments); };
})();
</script>"""

# Appended after it: compares with the legend, measures the layout.
CHECK = """<script>
(function () {
  var root = document.documentElement;
  var drawn = Array.from(window.__colours);  // before the scratch canvas below adds its own
  var scratch = document.createElement("canvas").getContext("2d");
  function norm(value) { scratch.fillStyle = "#000000"; scratch.fillStyle = value; return scratch.fillStyle; }
  var legend = new Set();
  document.querySelectorAll("#legend .sw").forEach(function (sw) {
    var cs = getComputedStyle(sw);
    [cs.backgroundColor, cs.borderTopColor, cs.borderLeftColor].forEach(function (c) { legend.add(norm(c)); });
  });
  var chrome = new Set();
  var style = getComputedStyle(root);
  for (var i = 0; i < style.length; i++) {
    if (style[i].indexOf("--ui-") === 0) chrome.add(norm(style.getPropertyValue(style[i]).trim()));
  }
  var missing = [];
  drawn.forEach(function (c) { if (!legend.has(c) && !chrome.has(c)) missing.push(c); });
  root.dataset.coloursUsed = String(drawn.length);
  root.dataset.coloursMissing = missing.join(" ");
  root.dataset.axisTexts = window.__texts.filter(function (t) { return /%$/.test(t); }).join(" ");
  var canvas = document.getElementById("timeline").getBoundingClientRect();
  var panel = document.getElementById("timeline-panel").getBoundingClientRect();
  var side = document.getElementById("side-panel").getBoundingClientRect();
  root.dataset.canvasWidth = String(Math.round(canvas.width));
  root.dataset.panelWidth = String(Math.round(panel.width));
  root.dataset.panelBottom = String(Math.round(panel.bottom));
  root.dataset.sideTop = String(Math.round(side.top));
  root.dataset.sideLeft = String(Math.round(side.left));
  root.dataset.viewport = String(window.innerWidth);
  root.dataset.scrollWidth = String(root.scrollWidth);
  // a table wider than its section scrolls sideways: clipped at first sight
  var clipped = [];
  document.querySelectorAll("section table").forEach(function (table) {
    var section = table.closest("section");
    if (section.scrollWidth > section.clientWidth + 1 || table.getBoundingClientRect().right > window.innerWidth + 1) {
      clipped.push(table.id + ":" + section.scrollWidth + ">" + section.clientWidth);
    }
  });
  root.dataset.clipped = clipped.join(" ");
  root.dataset.tables = String(document.querySelectorAll("section table").length);
  root.dataset.laneLabels = Array.from(document.querySelectorAll(".lane-label")).map(function (d) {
    return d.className.replace("lane-label", "").trim() || "tool";
  }).join(" ");
  var gpu = document.querySelector(".lane-label.gpu");
  root.dataset.gpuLabel = gpu ? gpu.textContent : "";
})();
</script>"""


def played(page: Path, tmp_path: Path) -> Path:
    text = page.read_text()
    text = text.replace("<style>", HOOK + "<style>", 1).replace("</body>", CHECK + "</body>", 1)
    out = tmp_path / "played.html"
    out.write_text(text)
    return out


@pytest.fixture(scope="module", params=[(800, 1000), (1280, 800), (1400, 900)], ids=["800", "1280", "1400"])
def opened(request, tmp_path_factory):
    """The report page, with the checks above played in it, opened once per
    window size in Chromium: (width, height, the run, its screenshot)."""
    width, height = request.param
    tmp_path = tmp_path_factory.mktemp(f"chromium-{width}")
    page = played(record_run(tmp_path, simulated=True), tmp_path)
    shot = tmp_path / f"report-{width}.png"
    result = chromium(
        tmp_path, page.as_uri(), "--dump-dom", f"--screenshot={shot}", "--hide-scrollbars", width=width, height=height
    )
    return width, height, result, shot


def test_in_chromium_every_colour_drawn_is_in_the_legend_and_the_timeline_keeps_the_width(opened):
    width, _, result, _ = opened
    assert result.returncode == 0, result.stderr[-2000:]
    assert console_messages(result) == []
    (root,) = Elements(result.stdout).where(tag="html")
    attrs = root["attrs"]
    assert int(attrs["data-colours-used"]) >= 8  # the canvas drew, with data and chrome colours
    assert attrs["data-colours-missing"] == ""
    assert attrs["data-axis-texts"].split() == ["100%", "50%", "0%"]  # the GPU lane's utilization axis
    assert attrs["data-gpu-label"].startswith("GPU 0") and "simulated" in attrs["data-gpu-label"]
    viewport = int(attrs["data-viewport"])
    assert viewport == width
    assert int(attrs["data-scroll-width"]) <= viewport  # nothing wider than the window
    canvas = int(attrs["data-canvas-width"])
    if width == 800:
        # the side panel goes under the timeline, which keeps the width
        assert int(attrs["data-side-top"]) >= int(attrs["data-panel-bottom"])
        assert int(attrs["data-panel-width"]) == width
        assert canvas >= 0.8 * width
    else:
        assert int(attrs["data-side-left"]) >= int(attrs["data-panel-width"])  # beside it
        assert canvas >= 0.5 * width
        # from 1280 px on, every table shows whole: no column behind a sideways scroll
        assert attrs["data-clipped"] == ""
        assert int(attrs["data-tables"]) >= 6
    # a lane for the event loop, between the GPU's and the model's and the tools'
    assert attrs["data-lane-labels"].split() == ["gpu", "model", "loop", "tool", "tool", "tool"]


def section_headers(text: str, title: str) -> list[str]:
    """The column headers of one section of the text table (the line after its title)."""
    lines = text.splitlines()
    index = next(i for i, line in enumerate(lines) if line.startswith(title))
    return re.split(r" {2,}", lines[index + 1].strip())


def html_headers(page: str, table_id: str) -> list[str]:
    """The header cells of one table of the page (elements are in document order)."""
    found = Elements(page).found
    at = next(i for i, e in enumerate(found) if e["tag"] == "table" and e["attrs"].get("id") == table_id)
    headers = []
    for element in found[at + 1 :]:
        if element["tag"] == "table":
            break
        if element["tag"] == "th":
            headers.append(element["text"])
    return headers


# The text table's columns and the HTML's, section by section: every one the
# text shows is in the page ("" the text's unnamed verdict column).
SAME_COLUMNS = {
    ("Tools, by", "tools-table"): {
        "TOOL": "tool",
        "UNUSED": "unused s",
        "BLOCKED": "blocked idle s",
        "IN QUEUE": "queue / exec s",
        "IN EXEC": "queue / exec s",
        "CALLS": "calls",
        "ERRORS": "errors",
        "P50": "p50 s",
        "P95": "p95 s",
        "P99": "p99 s",
        "QUEUE P95": "queue p95 s",
        "EXEC P95": "exec p95 s",
        "LOOP BLOCKED": "loop blocked s",
        "CPU": "CPU",
    },
    ("Event loops", "loops-table"): {
        "THREAD": "thread",
        "BLOCKS": "blocks",
        "BLOCKED": "blocked s",
        "LONGEST": "longest s",
        "BLOCKED BY": "blocked by (s)",
    },
    ("Models", "models-table"): {
        "MODEL": "model",
        "CALLS": "calls",
        "TIME": "s",
        "P50": "p50 s",
        "P95": "p95 s",
        "FIRST CHUNK P50": "first chunk p50 s",
        "IN TOKENS": "in tokens",
        "OUT TOKENS": "out tokens",
        "ERRORS": "errors",
        "GPU IDLE": "GPU idle s",  # the model server's share
    },
    ("Executors", "executors-table"): {
        "EXECUTOR": "executor",
        "SUBMITTED": "calls",
        "WAIT P95": "wait p95 s",
        "QUEUED": "queued",
        "MAX QUEUED": "max queued",
        "MAX RUNNING": "max running",
        "PEAK IN FLIGHT": "peak in flight",
        "MAX WORKERS": "max workers",
    },
    ("GPUs", "gpus-table"): {
        "GPU": "gpu",
        "BUSY": "busy s",
        "IDLE": "idle s",
        "BLOCKED BY TOOLS": "blocked s",
        "MODEL SERVER": "model server s",
        "UNATTRIBUTED": "unattributed s",
        "UTIL AVG": "util avg",
        "UNUSED": "unused s",
        "UNUSED BY TOOLS": "unused by tools s",
        "MISSING": "missing s",
    },
}


def test_the_page_shows_every_column_of_the_text_table(tmp_path, capsys):
    page = record_run(tmp_path, simulated=False)
    capsys.readouterr()
    assert main(["report", str(tmp_path / "research.jsonl"), "--gpu-log", str(tmp_path / "gpu.csv")]) == 0
    text = capsys.readouterr().out
    shown = page.read_text()
    for (title, table_id), columns in SAME_COLUMNS.items():
        headers = section_headers(text, title)
        assert set(headers) == set(columns), (title, headers)  # the mapping knows every column of the text
        assert {columns[h] for h in headers} <= set(html_headers(shown, table_id)), table_id
    # the event loop's row, as the text says it
    assert "embed 0.800, unknown 0.600" in shown
    # the model server's share: the text's sentence, word for word, and its columns
    (said,) = [line.strip() for line in text.splitlines() if "the model server idles the GPU" in line]
    (li,) = Elements(shown).where(tag="li", **{"data-model": "llama-3-70b"})
    assert li["text"] == said
    assert float(said.split("idles the GPU ")[1].split(" s")[0]) > 0


def test_screenshots_at_800_and_1400_px(opened):
    width, height, result, shot = opened
    assert result.returncode == 0, result.stderr[-2000:]
    assert console_messages(result) == []
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", data[16:24]) == (width, height)
    assert len(data) > 20_000  # a drawn page, not a blank one


def test_a_csv_without_names_from_real_nvidia_smi_is_not_simulated(tmp_path):
    write_gpu_csv(tmp_path / "gpu.csv", [(k / 10, 0, 50) for k in range(10)])
    log = read_gpu_log(str(tmp_path / "gpu.csv"), "UTC")
    assert log.names == {} and log.uuids == {}
