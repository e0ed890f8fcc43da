"""The imports keep the layout of docs/architecture.md.

Read with ``ast`` from every module of ``agent_otel`` (``exporters/``
included, through its link) and ``dashboards``, imports inside functions
included (those under ``if TYPE_CHECKING:`` are for the type checker only
and left out). The package's lazy public names (``agent_otel/__init__``)
count as imports of the modules they come from.

- no import cycles;
- no module imports a ``_private`` name of another module, ours or
  OpenTelemetry's (names a module lists in ``__all__`` are public, and
  two documented CPython functions are allowed, below);
- each room imports only the rooms below it (ROOMS).
"""

from __future__ import annotations

import ast
import functools
import importlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# room -> the rooms it may import (besides itself). Listed bottom up.
#
# A module's room is where it sits (``room_of``): the package under
# agent_otel/ it is in (agent_otel/capture/... is "capture"), but for the
# foundation, which is the modules at the top level (the contract:
# semconv, config, records, errors, slo, version) with their helpers in
# agent_otel/support/, and the package's face ("api"): agent_otel itself and
# agent_otel.tools, the decorator users import; and `python -m agent_otel`
# (agent_otel/__main__.py) is a command.
ROOMS: dict[str, set[str]] = {
    "foundation": set(),
    "capture": {"foundation"},
    "gpu": {"foundation"},
    "spans": {"foundation"},  # span decoding: exported and received spans -> records
    "exporters": {"foundation", "spans"},  # outputs: spans, metrics, files
    "attribution": {"foundation", "gpu", "capture"},
    "remedies": {"foundation", "capture"},
    "report": {"foundation", "spans", "gpu", "attribution", "exporters", "remedies"},
    "wiring": {"foundation", "capture", "gpu", "exporters", "attribution", "remedies"},
    "api": {"foundation", "capture", "remedies", "wiring"},
    "receiver": {"foundation", "spans"},  # the blame service's OTLP intake: never the report
    "demo": {"foundation", "api", "capture", "gpu", "exporters", "attribution", "remedies", "wiring"},
    "commands": {
        "foundation",
        "api",
        "spans",
        "capture",
        "gpu",
        "exporters",
        "attribution",
        "remedies",
        "report",
        "receiver",
        "wiring",
        "demo",
    },
    "dashboards": {"foundation"},
}
PACKAGE_FACE = {"agent_otel", "agent_otel.tools"}

# Documented CPython functions with no public spelling: a thread's stack; and
# the context key the OpenTelemetry SDK's own batch processors set while they
# export (no public name; exporters/batch.py says why it does not import
# opentelemetry-instrumentation's suppress_instrumentation instead).
ALLOWED_PRIVATE = {
    ("sys", "_getframe"),
    ("sys", "_current_frames"),
    ("opentelemetry.context", "_SUPPRESS_INSTRUMENTATION_KEY"),
}
# Modules whose private names the framework hooks must reach: the code they hook.
HOOKED_LIBRARIES = (
    "langchain_core",
    "langgraph",
    "agents",
    "llama_index",
    "mcp",
    "smolagents",
    "crewai",
    "pydantic_ai",
    "anyio",
)


def room_of(module: str) -> str:
    """The room of a module, from its path (see ROOMS)."""
    if module.startswith("dashboards"):
        return "dashboards"
    if module in PACKAGE_FACE:
        return "api"
    parts = module.split(".")
    if parts[-1] == "__main__":  # `python -m agent_otel`: a command
        return "commands"
    top_level_module = len(parts) == 2 and MODULES[module].name != "__init__.py"
    if top_level_module or parts[1] == "support":
        return "foundation"
    return parts[1]


def project_modules() -> dict[str, Path]:
    found = {}
    for top in ("agent_otel", "dashboards"):
        for folder, _dirs, files in os.walk(REPO / top, followlinks=True):  # agent_otel/exporters is a link
            for name in files:
                if name.endswith(".py"):
                    path = Path(folder) / name
                    parts = list(path.relative_to(REPO).with_suffix("").parts)
                    if parts[-1] == "__init__":
                        parts.pop()
                    found[".".join(parts)] = path
    return found


MODULES = project_modules()


def _resolve(name: str) -> str | None:
    """The project module ``name`` is in (the longest prefix that is one), or None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in MODULES:
            return candidate
    return None


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


class Imports:
    """What one module imports: project modules, and every (module, name) it reads."""

    def __init__(self, module: str, path: Path):
        self.module = module
        tree = ast.parse(path.read_text(), str(path))
        skipped = _type_checking_nodes(tree)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        self.modules: set[str] = set()
        self.names: list[tuple[str, str, int]] = []  # (module, name, line)
        aliases: dict[str, str] = {}  # local name -> the module it is
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    self._add_module(alias.name)
                    aliases[alias.asname or alias.name.split(".")[0]] = (
                        alias.name if alias.asname else alias.name.split(".")[0]
                    )
            elif isinstance(node, ast.ImportFrom):
                source = node.module or ""
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    if _resolve(full) == full:  # a project module (another library's: read as a name)
                        self._add_module(full)
                        aliases[alias.asname or alias.name] = full
                    else:
                        self._add_module(source)
                        self.names.append((source, alias.name, node.lineno))
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
                self.names.append((aliases[node.value.id], node.attr, node.lineno))
        if any(isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "_PUBLIC" for n in tree.body):
            # A package's lazy public names (agent_otel, agent_otel.remedies): name -> module.
            namespace: dict = {}
            exec(
                compile(
                    ast.Module(
                        [
                            n
                            for n in tree.body
                            if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "_PUBLIC"
                        ],
                        [],
                    ),
                    str(path),
                    "exec",
                ),
                namespace,
            )
            self.modules.update(namespace["_PUBLIC"].values())
        self.modules.discard(module)

    def _add_module(self, name: str) -> None:
        resolved = _resolve(name)
        if resolved is not None:
            self.modules.add(resolved)


@functools.cache
def all_imports() -> dict[str, Imports]:
    """Every project module's imports, parsed once per process, when a test first asks
    (not at collection: each pytest-xdist worker collects this file)."""
    return {module: Imports(module, path) for module, path in MODULES.items()}


def cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(all_imports()[module].modules):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(all_imports()):
        if module not in index:
            visit(module)
    return found


def test_the_analysis_sees_every_kind_of_import():
    assert "agent_otel.exporters.batch" in MODULES and "dashboards.build" in MODULES
    assert "agent_otel.report.reader" in all_imports()["agent_otel.report.analysis"].modules  # from x import y
    assert "agent_otel.remedies.options" in all_imports()["agent_otel.tools"].modules  # from x import y as z
    assert "agent_otel.gpu.nvml" in all_imports()["agent_otel.gpu.sources"].modules  # inside a function
    assert "agent_otel.wiring.instrumentation" in all_imports()["agent_otel"].modules  # a lazy public name


def test_no_import_cycles():
    assert cycles() == []


def test_no_module_imports_another_modules_private_names():
    found = []
    for module, imports in all_imports().items():
        for source, name, line in imports.names:
            if not name.startswith("_") or name.startswith("__") or (source, name) in ALLOWED_PRIVATE:
                continue
            if source.split(".")[0] in HOOKED_LIBRARIES and module.startswith("agent_otel.capture.frameworks"):
                continue
            if source == module:
                continue
            try:
                public = getattr(importlib.import_module(source), "__all__", ())
            except ImportError:
                public = ()
            if name not in public:
                found.append(f"{MODULES[module].relative_to(REPO)}:{line}: {source}.{name}")
    assert found == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_room_imports_only_the_rooms_below_it(module):
    room = room_of(module)
    for target in all_imports()[module].modules:
        target_room = room_of(target)
        assert target_room == room or target_room in ROOMS[room], f"{module} ({room}) imports {target} ({target_room})"


def test_the_blame_service_reads_spans_without_the_report():
    """The receiver decodes spans with agent_otel.spans, as the report does: it imports nothing of the report."""
    receiver = [module for module in all_imports() if _is(module, "agent_otel.receiver")]
    assert "agent_otel.receiver.decode" in receiver
    assert "agent_otel.spans.decode" in all_imports()["agent_otel.receiver.decode"].modules
    found = {
        (module, target)
        for module in receiver
        for target in all_imports()[module].modules
        if _is(target, "agent_otel.report")
    }
    assert found == set()


def test_span_decoding_is_a_room_that_imports_only_the_foundation():
    spans = [module for module in MODULES if _is(module, "agent_otel.spans")]
    assert {"agent_otel.spans.decode", "agent_otel.spans.otlp_json", "agent_otel.spans.protobuf"} <= set(spans)
    assert {room_of(module) for module in spans} == {"spans"}
    assert ROOMS["spans"] == {"foundation"}  # beside the contract: it imports nothing else


def test_every_module_has_a_room():
    assert {room_of(module) for module in MODULES} <= set(ROOMS)


def import_picture() -> dict[str, set[str]]:
    """room -> the rooms it imports: the picture in docs/architecture.md."""
    picture: dict[str, set[str]] = defaultdict(set)
    for module, imports in all_imports().items():
        for target in imports.modules:
            if room_of(target) != room_of(module):
                picture[room_of(module)].add(room_of(target))
    return picture


def test_the_picture_in_architecture_md_is_the_imports():
    lines = (REPO / "docs" / "architecture.md").read_text().splitlines()
    picture = import_picture()
    for room, targets in picture.items():
        line = f"{room} -> {', '.join(sorted(targets))}"
        assert line in lines, f"docs/architecture.md should say: {line}"


# What a default instrument() may not import on the caller's thread: each is
# imported where it is needed (docs/performance.md, "Start-up"). prometheus_client
# when a metric is first read or counted by prometheus_client itself, asyncio and
# the frameworks when the application imports them, NVML and the attribution on
# the GPU search's thread, the reader and gRPC never (the exporter is made on
# the export thread), wrapt and asyncio by the export thread's first export.
NOT_ON_THE_CALLERS_THREAD = (
    "prometheus_client",
    "asyncio",
    "wrapt",
    "msgspec",
    "orjson",
    "pynvml",
    "grpc",
    "google.protobuf",
    "http.server",
    "ssl",
    "agent_otel.attribution",
    "agent_otel.gpu",
    "agent_otel.report",
    "agent_otel.exporters.otlp_json",
    "agent_otel.spans",
    "opentelemetry.instrumentation",
    "opentelemetry.exporter",
    "langchain_core",
    "agents",
    "llama_index.core",
    "mcp",
    "smolagents",
)

STARTUP = r"""
import json, sys, threading

first_import_by = {}  # module -> the thread that first looked for it


class Watch:
    def find_spec(self, name, path=None, target=None):
        first_import_by.setdefault(name, threading.current_thread().name)
        return None


sys.meta_path.insert(0, Watch())
before_import = set(sys.modules)
import agent_otel

after_import = sorted(sys.modules)
added_by_import = sorted(set(sys.modules) - before_import)
handle = agent_otel.instrument()
handle.wait_for_gpu(30)
handle.shutdown(timeout_s=2)
imported = {name: thread for name, thread in first_import_by.items() if name in sys.modules}
print(json.dumps({"after_import": after_import, "added_by_import": added_by_import, "first_import_by": imported}))
"""


def _is(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_a_default_instrument_imports_only_what_its_defaults_need(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AGENT_OTEL_"))}
    env["AGENT_OTEL_SHUTDOWN_TIMEOUT"] = "2"
    done = subprocess.run(
        [sys.executable, "-c", STARTUP], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # import agent_otel: the version only (users import it first thing; its public names load on first use).
    assert result["added_by_import"] == ["agent_otel", "agent_otel.version"]
    assert not [m for m in result["after_import"] if _is(m, "opentelemetry")]
    on_callers_thread = [
        module
        for module, thread in result["first_import_by"].items()
        if thread == "MainThread" and any(_is(module, prefix) for prefix in NOT_ON_THE_CALLERS_THREAD)
    ]
    assert on_callers_thread == []
    # The watch sees imports: what instrument() does need was imported by the caller.
    assert result["first_import_by"]["opentelemetry.sdk.trace"] == "MainThread"
    assert result["first_import_by"]["agent_otel.exporters.otlp_json_file"] == "MainThread"


def test_the_report_loads_none_of_the_runtime():
    """`agent-otel report` reads files: it loads neither OpenTelemetry, the
    Prometheus client, the capture nor the remedies' blocks (only the snippets
    it prints, agent_otel.remedies.suggest)."""
    code = "import json, sys\nfrom agent_otel.commands import report as command\nfrom agent_otel.report import html\nprint(json.dumps(sorted(sys.modules)))\n"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    runtime = ("opentelemetry", "prometheus_client", "grpc", "agent_otel.capture", "agent_otel.wiring.instrumentation")
    assert [m for m in loaded if any(_is(m, prefix) for prefix in runtime)] == []
    assert [m for m in loaded if _is(m, "agent_otel.remedies")] == [
        "agent_otel.remedies",
        "agent_otel.remedies.suggest",
    ]
