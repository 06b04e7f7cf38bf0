"""Where the app writes when the user keeps its default folder (``e`` exports, ``w`` fixes): beside the
traces, except for traces inside the specdiff checkout (the shipped pair in traces/examples), whose
outputs go under the checkout's ignored ``specdiff-out/`` (.gitignore), so that trying the README's
examples leaves the working tree as it was (before this, ``w`` on the shipped pair wrote
``traces/examples/seed/fixed-draft``, untracked, and a test expecting that name free then failed).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHECKOUT", "IGNORED", "default_dir"]

#: the folder holding the product folders (tracer/, replay/, tui/, ...): the checkout of an editable
#: install; a wheel's install puts this module in site-packages, where no trace lies
CHECKOUT = Path(__file__).resolve().parents[1]
#: the checkout's folder for what the app writes for traces inside it (ignored by its .gitignore)
IGNORED = "specdiff-out"


def default_dir(trace: str | Path, name: str, *, checkout: Path | None = None) -> Path:
    """The default folder ``name`` (e.g. ``specdiff-exports``) for what the app writes about ``trace``:
    ``<trace's folder>/<name>``, or, when ``trace`` lies inside ``checkout`` (a source checkout: it holds
    a ``pyproject.toml``; default :data:`CHECKOUT`), ``<checkout>/specdiff-out/<trace's folder, relative
    to the checkout>/<name>``. Paths are resolved (symlinks followed); nothing is created."""
    folder = Path(trace).resolve().parent
    checkout = (CHECKOUT if checkout is None else checkout).resolve()
    if (checkout / "pyproject.toml").is_file() and folder.is_relative_to(checkout):
        return checkout / IGNORED / folder.relative_to(checkout) / name
    return folder / name
