"""Each setting declared once (agent_otel/config.py), and everything derived from it."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from agent_otel import config
from agent_otel.config import DEFAULTS, SETTINGS, Settings, load_settings, parse
from agent_otel.errors import ConfigError
from agent_otel.gpu.timeline import IdleDetector

REPO = Path(__file__).resolve().parents[1]


def test_the_readme_table_is_the_declaration():
    readme = (REPO / "README.md").read_text()
    assert config.readme_with_table(readme) == readme, "run: python -m agent_otel.config --write README.md"
    table = config.markdown_table()
    for info in SETTINGS.values():
        (row,) = [line for line in table.splitlines() if line.startswith(f"| `{info.name}` |")]
        assert info.declaration.help in row
        for variable in info.declaration.env:
            assert f"`{variable}`" in row


def test_the_check_command_fails_on_a_stale_table(tmp_path):
    readme = (REPO / "README.md").read_text()
    stale = tmp_path / "README.md"
    stale.write_text(readme.replace("seconds between NVML reads", "seconds between reads"))
    command = [sys.executable, "-m", "agent_otel.config", "--check"]
    assert subprocess.run([*command, str(REPO / "README.md")], capture_output=True).returncode == 0
    failed = subprocess.run([*command, str(stale)], capture_output=True, text=True)
    assert failed.returncode == 1 and "stale" in failed.stderr
    subprocess.run([sys.executable, "-m", "agent_otel.config", "--write", str(stale)], check=True)
    assert stale.read_text() == readme


def test_every_setting_is_declared_with_help_and_a_way_to_set_it():
    assert list(SETTINGS) == [f for f in Settings.__dataclass_fields__]
    for info in SETTINGS.values():
        assert info.declaration.help, info.name
        assert info.declaration.env or info.name == "redact", info.name
        assert getattr(DEFAULTS, info.name) == info.default
        if info.declaration.low is not None and info.default is not None:
            assert info.declaration.low <= info.default <= info.declaration.high, info.name


@pytest.mark.parametrize("name", [n for n, i in SETTINGS.items() if i.declaration.high is not None])
def test_bounds_are_enforced_from_the_declaration_wherever_the_value_comes_from(name):
    info = SETTINGS[name]
    low, high = info.declaration.low, info.declaration.high
    assert parse(name, low) == low and parse(name, high) == high
    just_over = high + 1 if isinstance(info.default, int) else high * 1.001
    with pytest.raises(ConfigError, match=f"for {name}: expected .*{config.number_text(high)}"):
        parse(name, just_over)
    variable = info.declaration.env[0]
    scale = 1000 if info.declaration.env_unit == "ms" else 1
    with pytest.raises(ConfigError, match=variable):
        load_settings({}, {variable: str(just_over * scale)})
    assert getattr(load_settings({}, {variable: config.number_text(high * scale)}), name) == high


def test_environment_then_command_defaults_then_declared_defaults():
    env = {"AGENT_OTEL_GPU": "simulated", "OTEL_BSP_SCHEDULE_DELAY": "250"}
    settings = load_settings({"gpu_min_idle": 0.2}, env, defaults={"gpu": "nvml", "prometheus_port": 9400})
    assert settings.gpu == "simulated"  # the environment wins over a command's default
    assert settings.prometheus_port == 9400  # the command's default wins over the declared one
    assert settings.export_interval == 0.25  # milliseconds in the variable, seconds in the setting
    assert settings.gpu_min_idle == 0.2 and settings.gpu_idle_threshold == DEFAULTS.gpu_idle_threshold
    assert load_settings({"gpu": "off"}, env).gpu == "off"  # an argument wins over the environment


@pytest.mark.parametrize(
    ("name", "given", "value"),
    [
        ("traces_exporters", "", None),
        ("traces_exporters", "OTLP, console", ("otlp", "console")),
        ("frameworks", "", ()),
        ("frameworks", ["langchain"], ("langchain",)),
        ("gpu_devices", "", None),
        ("gpu", "Replay:/tmp/G.log", "replay:/tmp/G.log"),
        ("gpu", "NVML", "nvml"),
        ("sdk_disabled", "yes", True),
        ("prometheus_port", "0", 0),
        ("otlp_protocol", "HTTP/protobuf", "http/protobuf"),
    ],
)
def test_values_are_parsed_into_the_setting_type(name, given, value):
    assert parse(name, given) == value


@pytest.mark.parametrize(
    ("name", "given"),
    [
        ("prometheus_port", "80.5"),
        ("prometheus_port", 8.5),
        ("prometheus_port", True),
        ("gpu", "nvidia"),
        ("traces_exporters", "otlp,zipkin"),
        ("sdk_disabled", "maybe"),
        ("service_name", " "),
        ("redact", "x"),
    ],
)
def test_bad_values_name_the_setting_and_the_value(name, given):
    with pytest.raises(ConfigError) as caught:
        parse(name, given, "--the-option")
    assert "--the-option" in str(caught.value) and repr(given) in str(caught.value)


def test_library_classes_check_the_same_bounds():
    with pytest.raises(ConfigError, match="expected a ratio from 0 to 1"):
        IdleDetector(1.5, 0.5)
    with pytest.raises(ConfigError, match="min_idle_s: expected seconds from 0.001 to 3600"):
        IdleDetector(0.1, 0.0)


def test_command_line_options_take_help_default_and_variables_from_the_declaration():
    parser = argparse.ArgumentParser()
    config.add_argument(parser, "--min-idle", "gpu_min_idle", metavar="S")
    config.add_argument(parser, "--port", "prometheus_port", default=9400, environment=False)
    text = parser.format_help().replace("\n", " ")
    assert "seconds an idle stretch must last to become a window (default: 0.5) [AGENT_OTEL_GPU_MIN_IDLE]" in " ".join(
        text.split()
    )
    assert "(default: 9400)" in text and "AGENT_OTEL_PROMETHEUS_PORT" not in text
    args = parser.parse_args(["--min-idle", "0.25"])
    assert args.gpu_min_idle == 0.25 and args.prometheus_port is None


def test_a_python_bool_for_a_choice_with_off_and_auto():
    assert parse("gpu", False) == "off" and parse("gpu", True) == "auto"
    with pytest.raises(ConfigError, match="'false'"):  # text is not a Python bool: still a choice
        parse("gpu", "false")
