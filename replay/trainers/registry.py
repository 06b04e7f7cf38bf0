"""The trainers ``record train --trainer`` can compute the training side with, and how to get one.

``specdiff`` is the reference forward (``replay.model.draft_model``, the default). The others are
optional packages installed ``--no-deps`` into the main environment (their pins are wider than
what their draft code needs: Makefile ``install``); each has one adapter module here that builds
the draft with the trainer's own class and runs its TTT steps (``TrainerDraft``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch

from specdiff.replay.trainers.errors import RecordTrainError

__all__ = ["TRAINERS", "DEFAULT_TRAINER", "Trainer", "trainer_version", "require_trainer", "load_trainer_draft"]

DEFAULT_TRAINER = "specdiff"


@dataclass(frozen=True)
class Trainer:
    """One external trainer: its distribution, the version the adapter was written against, the
    adapter module, and the install line to print when it is missing."""

    name: str
    dist: str
    tested_version: str
    adapter: str
    pip: str


TRAINERS: dict[str, Trainer | None] = {
    "specdiff": None,
    "specforge": Trainer("specforge", "specforge", "0.2.0", "specdiff.replay.trainers.specforge",
                         "pip install --no-deps specforge==0.2.0"),
    "speculators": Trainer("speculators", "speculators", "0.9.0", "specdiff.replay.trainers.speculators",
                           "pip install --no-deps speculators==0.9.0 hs-connectors==0.9.0"),
}


def trainer_version(name: str) -> str | None:
    """The installed version of trainer ``name``'s package; None when it is not installed."""
    t = TRAINERS[name]
    if t is None:
        return None
    try:
        return metadata.version(t.dist)
    except metadata.PackageNotFoundError:
        return None


def require_trainer(name: str) -> Trainer | None:
    """The trainer ``name`` (None for ``specdiff``), checked to be installed.

    Raises:
        RecordTrainError: an unknown name, or its package is not installed (the line names the pip
            command; ``record train`` exits 2).
    """
    if name not in TRAINERS:
        raise RecordTrainError(f"--trainer {name!r}: use one of {', '.join(TRAINERS)}")
    t = TRAINERS[name]
    if t is not None and trainer_version(name) is None:
        raise RecordTrainError(f"--trainer {name}: the {t.dist} package is not installed; run `{t.pip}` "
                               "(or `make install`)")
    return t


def load_trainer_draft(name: str, *, target_dir: str | Path, loaded, dtype: torch.dtype, device: str,
                       aux_hf_indices=None):
    """Build the draft of ``loaded`` (a ``replay.model.checkpoint.LoadedDraft``: its path and
    parsed config) with trainer ``name``'s own class and loading code; returns its ``TrainerDraft``.
    ``aux_hf_indices``: this run's training aux layers (a trainer whose config holds ids gets them).

    Raises:
        RecordTrainError: not installed, or the trainer cannot hold this draft (one line).
    """
    t = require_trainer(name)
    if t is None:
        raise RecordTrainError("--trainer specdiff is the reference draft; it has no trainer adapter")
    module = importlib.import_module(t.adapter)
    return module.load(target_dir=Path(target_dir), loaded=loaded, dtype=dtype, device=device,
                       version=trainer_version(name), aux_hf_indices=aux_hf_indices)
