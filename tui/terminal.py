"""The app on a terminal: whether there is one, and running it so that Ctrl-C quits it cleanly.

Textual (8.x, ``drivers/linux_driver.py``) reads keys from stdin and draws on stderr: without a
terminal on both it waits for keys that never come or draws escape codes into a file.
Once the app has the terminal, Ctrl-C is a key it reads; before (while it starts) the terminal
still turns it into SIGINT, and a KeyboardInterrupt raised inside the app's running event loop
leaves its tasks pending ("Task was destroyed but it is pending!") and prints tracebacks.
:func:`run_app` turns that SIGINT into the app's own exit instead, and raises both ways of
Ctrl-C (the signal, or the key the app exits on with 130) as KeyboardInterrupt for the CLI's line.
"""

from __future__ import annotations

import asyncio
import signal
import sys
import threading
from typing import TYPE_CHECKING

from specdiff.tui.cli import EXIT_INTERRUPTED

if TYPE_CHECKING:
    from textual.app import App


def has_terminal() -> bool:
    """stdin and stderr are both terminals (what the app reads keys from and draws on)."""
    return all(s is not None and s.isatty() for s in (sys.stdin, sys.stderr))


def run_app(app: App) -> int:
    """Run the Textual ``app`` and return its return code (None read as 0).

    SIGINT while the app's event loop runs asks the app to exit (``App.exit``, through its message
    queue: its tasks shut down in order and the terminal is restored), and is then raised here as
    KeyboardInterrupt; before the loop starts or after it ends it raises KeyboardInterrupt at once,
    as Python's default handler does. The previous handler is back when this returns.

    Raises:
        KeyboardInterrupt: Ctrl-C (SIGINT) while the app started, ran or closed, or the app exited with
            130 (``EXIT_INTERRUPTED``: the app's own Ctrl-C key, tui/app.py ``action_help_quit``).
    """
    interrupted = False

    def on_sigint(signum, frame):
        nonlocal interrupted
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # the app's loop is not running: nothing to shut down
            raise KeyboardInterrupt from None
        interrupted = True
        # exit from the app's own queue: processed once the screen is mounted (App.exit at once,
        # while the app composes, leaves its on_mount querying widgets that never came)
        loop.call_soon_threadsafe(app.call_later, app.exit)

    main = threading.current_thread() is threading.main_thread()  # only the main thread sets handlers
    previous = signal.signal(signal.SIGINT, on_sigint) if main else None
    try:
        app.run()
    finally:
        if main:
            signal.signal(signal.SIGINT, previous)
    if interrupted or app.return_code == EXIT_INTERRUPTED:
        raise KeyboardInterrupt
    return app.return_code or 0
