"""The Textual pilot helpers (registered by tests/conftest.py): ``tui`` (wait for a predicate between
pilot pauses, a widget's or a renderable's plain text, the app's notices, the app on a
pseudo-terminal as a user runs it) and ``anyio_backend`` (the pilot's async tests run on asyncio)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    """Async tests (``pytest.mark.anyio``: the Textual pilot) run on asyncio."""
    return "asyncio"


async def _wait_for(pilot, predicate, *, timeout: float = 30.0) -> None:
    """Poll ``predicate`` between pilot pauses (no fixed sleeps); AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached within the timeout")
        await pilot.pause(0.02)
    await pilot.pause()


def _ready(app):
    """Predicate: the app has its view model and a selection (the report is loaded)."""
    return lambda: app.vm is not None and app.sel is not None


def _plain(renderable, width: int = 110) -> str:
    """A Rich renderable as plain text (no colour), ``width`` columns."""
    from rich.console import Console

    with open(os.devnull, "w") as sink:
        console = Console(width=width, record=True, color_system=None, file=sink)
        console.print(renderable)
    return console.export_text()


def _static_text(app, selector: str) -> str:
    """The plain text of the widget ``selector`` (a ``Static``)."""
    return _plain(app.query_one(selector).content)


def _notices(app) -> list[str]:
    """The messages ``app.notify`` is given from now on, in order (the toast itself is not shown)."""
    said: list[str] = []
    app.notify = lambda message, **kw: said.append(message)
    return said


def _on_pty(args: list[str], *, ready: bytes, key: bytes = b"q", cwd: Path = ROOT,
            timeout: float = 240) -> tuple[int, str]:
    """``python -m specdiff.tui ARGS`` (the app) on a pseudo-terminal of 120x40: press ``key`` once the
    screen shows ``ready``; (exit code, everything it drew, escape codes included)."""
    import fcntl
    import pty
    import select
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "specdiff.tui", *map(str, args)], cwd=cwd, stdin=slave,
                            stdout=slave, stderr=slave, env={**os.environ, "TERM": "xterm-256color"},
                            close_fds=True)
    os.close(slave)
    seen, deadline, pressed = b"", time.monotonic() + timeout, False
    try:
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 1 << 16)
                except OSError:  # the app closed the terminal
                    break
            if not pressed and ready in seen:
                os.write(master, key)
                pressed = True
        assert pressed, f"the app never showed {ready!r}: {seen[-2000:]!r}"
        code = proc.wait(timeout=60)
        while select.select([master], [], [], 0.1)[0]:  # what it printed after the app closed
            try:
                data = os.read(master, 1 << 16)
            except OSError:
                break
            if not data:
                break
            seen += data
        return code, seen.decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)


@pytest.fixture(scope="session")
def tui() -> SimpleNamespace:
    """Pilot helpers: ``await tui.wait_for(pilot, tui.ready(app))``, ``tui.static_text(app, "#verdict")``,
    ``tui.plain(renderable)``, ``said = tui.notices(app)``; and the app as a user runs it: ``tui.on_pty(args, ready=b"...", key=b"q")``."""
    return SimpleNamespace(wait_for=_wait_for, ready=_ready, plain=_plain, static_text=_static_text,
                           notices=_notices, on_pty=_on_pty)
