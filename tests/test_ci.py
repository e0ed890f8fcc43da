"""CI runs every test: the README's command (parallel, slow tests left out) and the slow ones."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_test_command() -> str:
    section = (REPO / "README.md").read_text().split("run the test suite:", 1)[1]
    return re.search(r"```sh\n(.*?)\n```", section, re.S).group(1)


def ci_lines() -> list[str]:
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


def test_ci_ends_with_the_readmes_test_command_which_runs_in_parallel():
    command = readme_test_command()
    assert ci_lines()[-1] == command
    pytest_args = shlex.split(command.rsplit("&&", 1)[1])
    assert pytest_args[:3] == [".venv/bin/python", "-m", "pytest"]
    assert "-n" in pytest_args  # pytest-xdist, from the dev extra


def test_the_slow_tests_are_left_out_by_default_and_run_by_ci(pytestconfig):
    addopts = pytestconfig.getini("addopts")
    assert "--strict-markers" in addopts
    assert addopts[addopts.index("-m") + 1] == "not slow"
    assert any(marker.startswith("slow:") for marker in pytestconfig.getini("markers"))
    slow_steps = [line for line in ci_lines() if "pytest" in line and "-m slow" in line]
    assert len(slow_steps) == 1
    # The same venv as the README's command, with no path or -k narrowing it.
    assert slow_steps[0].startswith(".venv/bin/python -m pytest") and "tests/" not in slow_steps[0]
    assert " -k " not in slow_steps[0]
