"""Which trace a traced server on this machine writes, by its HTTP port.

The recorder (scheduler process) registers ``<port> -> trace path`` when it opens the trace, so
``specdiff record client --url http://host:PORT`` can say where the trace of a server that died
under its requests is. One small JSON file per port under the user's temp folder; a later
server on the same port replaces the entry.
"""

from __future__ import annotations

import json
import os
import tempfile
from urllib.parse import urlparse


def registry_dir() -> str:
    """``<tmp>/specdiff-<uid>/servers``: per user, so two users' servers never mix."""
    uid = os.getuid() if hasattr(os, "getuid") else "user"
    return os.path.join(tempfile.gettempdir(), f"specdiff-{uid}", "servers")


def register_server(*, port: int, trace: str) -> str | None:
    """Record that the server on ``port`` writes ``trace``; returns the entry's path (None on an
    OS error: the registry is a convenience, never a reason to stop tracing)."""
    try:
        os.makedirs(registry_dir(), exist_ok=True)
        path = os.path.join(registry_dir(), f"{int(port)}.json")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump({"trace": os.path.abspath(trace), "pid": os.getpid()}, f)
        os.replace(tmp, path)
        return path
    except OSError:
        return None


def trace_of_server(url: str) -> str | None:
    """The trace registered for the port of ``url`` (e.g. ``http://127.0.0.1:30000``), or None."""
    port = urlparse(url).port
    if port is None:
        return None
    try:
        with open(os.path.join(registry_dir(), f"{port}.json")) as f:
            trace = json.load(f).get("trace")
    except (OSError, ValueError, AttributeError):
        return None
    return trace if isinstance(trace, str) else None
