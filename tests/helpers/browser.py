"""Headless Chromium for the tests of the HTML the report writes, and a reader of its DOM."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

from conftest import require_tool

WIDTH, HEIGHT = 1600, 900


def chromium(
    tmp_path: Path, url: str, *extra: str, width: int = WIDTH, height: int = HEIGHT
) -> subprocess.CompletedProcess:
    """Run headless Chromium on ``url`` at ``width`` x ``height``, a fresh
    profile per size; console messages land in stderr
    (``--enable-logging=stderr``) as lines containing ``CONSOLE``."""
    binary = require_tool("chromium")
    command = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / f'chromium-profile-{width}x{height}'}",
        f"--window-size={width},{height}",
        "--enable-logging=stderr",
        "--v=0",
        *extra,
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def console_messages(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if ":CONSOLE" in line]


class Elements(HTMLParser):
    """Every element's tag, attributes and own text, in document order."""

    def __init__(self, page: str):
        super().__init__()
        self.found: list[dict] = []
        self._stack: list[dict] = []
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        element = {"tag": tag, "attrs": dict(attrs), "text": ""}
        self.found.append(element)
        if tag not in ("meta", "br", "img", "input", "link", "i"):
            self._stack.append(element)

    def handle_endtag(self, tag):
        while self._stack:
            if self._stack.pop()["tag"] == tag:
                break

    def handle_data(self, data):
        for element in self._stack:
            element["text"] += data

    def where(self, tag: str | None = None, **attrs) -> list[dict]:
        return [
            e for e in self.found if tag in (None, e["tag"]) and all(e["attrs"].get(k) == v for k, v in attrs.items())
        ]
