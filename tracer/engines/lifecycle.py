"""What every engine plugin does at process end: close its trace on SIGTERM, then let the
engine's own handler (or the default action) run."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


def close_on_sigterm(close: Callable[[], None]) -> None:
    """Install a SIGTERM handler that calls ``close()`` first, then the handler that was there
    (or the default action: the process still terminates). Engines stop their workers with
    SIGTERM, and a trace closed here is finalized instead of left for recovery.

    Does nothing outside the main thread (Python allows signal handlers only there).
    """
    try:
        prev = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return

    def _on_term(signum, frame):
        close()
        if callable(prev) and prev not in (signal.SIG_IGN, signal.SIG_DFL):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, _on_term)
    except (ValueError, OSError):  # not the main thread
        pass
