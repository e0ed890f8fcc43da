"""Each registry is declared once, and what is written elsewhere matches it.

pyproject.toml cannot import the code: its framework entry points and
extras are checked here against ``agent_otel.capture.frameworks.FRAMEWORKS``.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from agent_otel.capture import frameworks
from agent_otel.capture.frameworks import FRAMEWORKS, Framework

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _pyproject() -> dict:
    return tomllib.loads(PYPROJECT.read_text())


def _requirements(lines) -> dict[str, tuple[frozenset[str], str]]:
    """name -> (extras, specifier) of pip requirement lines; a name given twice is an error."""
    found: dict[str, tuple[frozenset[str], str]] = {}
    for line in lines:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name not in found, f"{name} listed twice"
        found[name] = (frozenset(requirement.extras), str(requirement.specifier))
    return found


def _registry_extra(extra: str, registry: dict[str, Framework]) -> dict[str, tuple[frozenset[str], str]]:
    lines = []
    for framework in registry.values():
        if framework.extra == extra:
            requirement = Requirement(framework.requirement)
            requirement.extras = set(framework.pip_extras)
            lines += [str(requirement), *framework.companions]
    return _requirements(lines)


def _entry_points(registry: dict[str, Framework]) -> dict[str, str]:
    return {
        frameworks.ENTRY_POINT_PREFIX + name: f"agent_otel.wiring.instrumentors:{framework.instrumentor}"
        for name, framework in registry.items()
    }


def _drift(pyproject: dict, registry: dict[str, Framework]) -> list[str]:
    """How pyproject's framework entry points and extras differ from ``registry``."""
    problems = []
    declared = pyproject["project"]["entry-points"]["opentelemetry_instrumentor"]
    if declared != _entry_points(registry):
        problems.append(f"entry points: pyproject {declared} != registry {_entry_points(registry)}")
    extras = pyproject["project"]["optional-dependencies"]
    for extra in sorted({framework.extra for framework in registry.values()}):
        listed, wanted = _requirements(extras.get(extra, ())), _registry_extra(extra, registry)
        if listed != wanted:
            problems.append(f"extra {extra!r}: pyproject {listed} != registry {wanted}")
    return problems


def test_pyproject_entry_points_and_extras_match_the_framework_registry():
    assert _drift(_pyproject(), FRAMEWORKS) == []


def test_a_drift_either_way_is_found():
    pyproject = _pyproject()
    # A framework added to the registry only:
    grown = {**FRAMEWORKS, "newframe": Framework("h", "newframe", "newframe >= 1, < 2", "NewInstrumentor")}
    assert len(_drift(pyproject, grown)) == 2  # its entry point and its requirement are missing
    # A version bumped in pyproject only:
    bumped = _pyproject()
    extra = bumped["project"]["optional-dependencies"]["frameworks"]
    extra[:] = [line.replace("mcp>=2.3,<3", "mcp>=2.4,<3") for line in extra]
    assert [problem.split(":")[0] for problem in _drift(bumped, FRAMEWORKS)] == ["extra 'frameworks'"]
    # An entry point removed from pyproject only:
    del pyproject["project"]["entry-points"]["opentelemetry_instrumentor"]["agent_otel_mcp"]
    assert [problem.split(":")[0] for problem in _drift(pyproject, FRAMEWORKS)] == ["entry points"]


def test_each_framework_has_its_hook_module_and_instrumentor():
    import importlib.util

    from agent_otel.wiring import instrumentors

    for name, framework in FRAMEWORKS.items():
        assert importlib.util.find_spec(framework.hook) is not None, framework.hook
        cls = getattr(instrumentors, framework.instrumentor)
        assert cls is instrumentors.INSTRUMENTORS[name]
        assert (cls.framework, cls.module) == (name, framework.module)
        assert cls().instrumentation_dependencies() == (framework.requirement,)
        assert issubclass(cls, instrumentors.FrameworkInstrumentor)


# ---------------------------------------------------------------- GPU sources


def _package_modules():
    """(path, syntax tree) of every module of the package (exporters/ once: agent_otel/exporters links to it)."""
    import ast

    root = Path(__file__).resolve().parents[1]
    paths = [path for path in (root / "agent_otel").rglob("*.py") if "exporters" not in path.parts[-2:-1]]
    for path in sorted(paths + list((root / "exporters").glob("*.py"))):
        yield path, ast.parse(path.read_text(), str(path))


def test_the_gpu_setting_offers_each_gpu_source_of_the_registry():
    from agent_otel import config, semconv
    from agent_otel.gpu.sources import open_gpu_source

    assert config.GPU_CHOICES[0] == config.GPU_AUTO and config.GPU_CHOICES[-1] == config.GPU_OFF
    offered = [choice.removesuffix("PATH").rstrip(":") for choice in config.GPU_CHOICES[1:-1]]
    assert offered == list(semconv.GPU_SOURCES)
    assert config.load_settings({"gpu": semconv.GPU_SOURCE_SIMULATED}, environ={}).gpu == semconv.GPU_SOURCE_SIMULATED
    # each kind opens a source of that kind
    opened = {
        semconv.GPU_SOURCE_NVML: open_gpu_source(semconv.GPU_SOURCE_NVML),
        semconv.GPU_SOURCE_SIMULATED: open_gpu_source(semconv.GPU_SOURCE_SIMULATED),
        semconv.GPU_SOURCE_SERVER: open_gpu_source(
            semconv.GPU_SOURCE_SERVER, model_server="http://127.0.0.1:9/metrics"
        ),
    }
    for kind, source in opened.items():
        assert source is not None and source.kind == kind
        source.close()


def test_gpu_sources_and_their_kinds_are_named_once():
    import ast

    from agent_otel import semconv

    kinds = set(semconv.GPU_SOURCES)
    for path, tree in _package_modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                names = [target.id for target in node.targets if isinstance(target, ast.Name)]
                assert "GPU_SOURCES" not in names or path.name == "semconv.py", f"{path}: a second GPU_SOURCES"
            if isinstance(node, ast.Compare) and path.name != "semconv.py":
                written = [
                    operand.value
                    for operand in (node.left, *node.comparators)
                    if isinstance(operand, ast.Constant) and operand.value in kinds
                ]
                assert not written, f"{path}:{node.lineno} compares with {written[0]!r}: use semconv.GPU_SOURCE_*"


# ---------------------------------------------------------------- metrics


def test_each_metric_spec_says_how_it_is_kept_and_by_which_attribute():
    from agent_otel import semconv

    owners: dict[tuple[bool, bool], set[str]] = {}
    for spec in semconv.METRICS.values():
        assert spec.kept in semconv.KEPT, spec
        assert (spec.kept == semconv.KEPT_SCRAPE) == (spec.attribute == ""), spec
        if spec.kept == semconv.KEPT_PIPELINE:  # a PipelineCounter or PipelineHistogram, of Metrics
            assert spec.kind != semconv.GAUGE and not (spec.remedy or spec.blame_service), spec
        if spec.attribute:
            attributes = owners.setdefault((spec.remedy, spec.blame_service), set())
            assert spec.attribute not in attributes, f"{spec.attribute} names two metrics"
            attributes.add(spec.attribute)


def test_the_exporter_makes_each_metric_from_its_spec():
    import math
    from collections import deque

    from agent_otel import semconv
    from agent_otel.exporters.prometheus import BlameServiceMetrics, Metrics
    from agent_otel.records import ToolCall

    metrics = Metrics()
    with metrics.lock:
        metrics.observe_calls([ToolCall("t", "direct", 1, 1, 2_000_000, trace_id=1)])
        metrics.observe_waits([("pool", deque([1_000]))])
    blame = BlameServiceMetrics(
        metrics.registry, metrics.tool_label, held_calls=lambda: 0, dropped_calls=lambda: 0, lag_s=lambda: 0.0
    )
    for spec in semconv.METRICS.values():
        if spec.kept in (semconv.KEPT_SCRAPE, semconv.KEPT_PIPELINE):
            continue
        owner = blame if spec.blame_service else metrics.remedies if spec.remedy else metrics
        metric = getattr(owner, spec.attribute)
        child = metric.labels(*("v" for _ in spec.labels)) if spec.labels else metric
        getattr(child, {semconv.COUNTER: "inc", semconv.GAUGE: "set", semconv.HISTOGRAM: "observe"}[spec.kind])(0.5)
    families = {family.name: family for family in metrics.registry.collect()}
    for spec in semconv.METRICS.values():
        family = families[spec.name.removesuffix("_total") if spec.kind == semconv.COUNTER else spec.name]
        assert (family.type, family.documentation) == (spec.kind, spec.help), spec.name
        if spec.kept == semconv.KEPT_SCRAPE:
            continue  # computed at scrape from live tables: empty here
        assert family.samples, spec.name
        for sample in family.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels), (spec.name, sample)
        if spec.kind == semconv.HISTOGRAM:
            bounds = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
            assert bounds == [*map(float, spec.buckets), math.inf], spec.name
    assert set(families) - {"target"} == {
        spec.name.removesuffix("_total") if spec.kind == semconv.COUNTER else spec.name
        for spec in semconv.METRICS.values()
    }
