"""The ``agent-otel`` command line: one subcommand per module.

Each subcommand lives in its own module, which exposes
``add_arguments(parser)`` and ``run(args) -> int``. This file only wires
them together, and turns the toolkit's own errors into one clear line and
exit status 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from agent_otel.version import __version__
from agent_otel.errors import AgentOtelError

# name -> (module, one-line help). Add a line when a subcommand lands.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": (
        "agent_otel.commands.demo",
        "Run a demo agent on a simulated GPU, twice: as commonly written and fixed; print what blocked the GPU",
    ),
    "report": (
        "agent_otel.commands.report",
        "Summarise exported traces: which tool blocked the GPU, queue versus exec, and what to change",
    ),
    "gpu-exporter": (
        "agent_otel.commands.gpu_exporter",
        "Sample the GPUs of this host: gpu.idle spans over OTLP and GPU metrics on /metrics",
    ),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that subcommand's module is
    imported (the others' arguments are not needed to run it)."""
    parser = argparse.ArgumentParser(
        prog="agent-otel",
        description="Trace LLM agent tool calls and find the ones that leave the GPU idle.",
    )
    parser.add_argument("--version", action="version", version=f"agent-otel {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        command_parser = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            module = importlib.import_module(module_name)
            module.add_arguments(command_parser)
            command_parser.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(chosen if chosen in COMMANDS else None).parse_args(argv)
    try:
        return int(args._module.run(args) or 0)
    except AgentOtelError as exc:
        print(f"agent-otel {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of our output went away (| head)
        _silence_stdout()
        return 141


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so flushing it at exit raises nothing."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
