"""The dashboard for tests that read what it told the user in toasts: each `notify` call kept in `toasts`, in order
(Textual keeps its own list of notifications private)."""

from __future__ import annotations

from typing import NamedTuple

from tokentui.tui import TokentuiApp


class Toast(NamedTuple):
    message: str
    severity: str


class NotingApp(TokentuiApp):
    def __init__(self, *args, **kwargs) -> None:
        self.toasts: list[Toast] = []  # before the app starts: a toast may come while it is built
        super().__init__(*args, **kwargs)

    def notify(self, message: str, *, title: str = "", severity: str = "information",  # type: ignore[override]
               timeout: float | None = None, markup: bool = False) -> None:
        self.toasts.append(Toast(str(message), severity))
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)
