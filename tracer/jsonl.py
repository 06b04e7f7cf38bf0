"""Reading prompt files: one JSON value per line (the format `record client` and `record train` take)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from specdiff.tracer.errors import SpecdiffError


def iter_jsonl(path, *, error=SpecdiffError) -> Iterator[tuple[int, object]]:
    """Yield ``(line number, value)`` for every non-blank line of a JSONL file.

    Raises:
        ``error`` (a SpecdiffError subclass): the file cannot be read, or a line is not JSON;
            the message names ``path:line``.
    """
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise error(f"{path}: cannot read prompts ({exc.strerror})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield n, json.loads(line)
        except json.JSONDecodeError as exc:
            raise error(f"{path}:{n}: not JSON ({exc.msg})") from None
