"""An indented line writer: the one way generated source is assembled."""

from __future__ import annotations

import contextlib
from typing import Iterator


class LineWriter:
    def __init__(self) -> None:
        self._lines: list[str] = []
        self._depth = 0

    def line(self, text: str = "") -> None:
        self._lines.append(("    " * self._depth + text) if text else "")

    def lines(self, texts: list[str]) -> None:
        for t in texts:
            self.line(t)

    @contextlib.contextmanager
    def indent(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    def source(self) -> str:
        return "\n".join(self._lines) + "\n"
