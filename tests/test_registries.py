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
        frameworks.ENTRY_POINT_PREFIX + name: f"agent_otel.instrumentors:{framework.instrumentor}"
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

    from agent_otel import instrumentors

    for name, framework in FRAMEWORKS.items():
        assert importlib.util.find_spec(framework.hook) is not None, framework.hook
        cls = getattr(instrumentors, framework.instrumentor)
        assert cls is instrumentors.INSTRUMENTORS[name]
        assert (cls.framework, cls.module) == (name, framework.module)
        assert cls().instrumentation_dependencies() == (framework.requirement,)
        assert issubclass(cls, instrumentors.FrameworkInstrumentor)
