"""Files a command writes whole or not at all: an interrupted or failed run never leaves a half
report that looks complete. The text goes to a temporary file beside the target, which
is renamed over it once written (``os.replace``: atomic on one POSIX filesystem)."""

from __future__ import annotations

import os
from pathlib import Path

from specdiff.tracer.errors import SpecdiffError


def check_writable(path: str | Path, *, option: str) -> Path:
    """``path`` as a Path, refused now (before any work) when its folder is missing or not writable,
    or ``path`` is a folder.

    Raises:
        SpecdiffError: one line naming ``option`` and what to do.
    """
    p = Path(path)
    if p.is_dir():
        raise SpecdiffError(f"{option} {path}: is a folder; give a file path")
    if not p.parent.is_dir():
        raise SpecdiffError(f"{option} {path}: folder {p.parent} does not exist; create it or choose another path")
    if not os.access(p.parent, os.W_OK):
        raise SpecdiffError(f"{option} {path}: folder {p.parent} is not writable; choose another path")
    return p


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` (created with the umask's permissions, or replaced) so that it
    is either complete or as it was: written to ``.<name>.<pid>.partial`` beside it, then renamed.
    The temporary file is removed when writing fails or is interrupted.

    Raises:
        OSError: the folder cannot be written (the temporary file is gone).
    """
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.partial")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, p)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
