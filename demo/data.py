"""The demo's token dataset (``traces/models/data/sequences.safetensors``): read by the demo and tests.

Written once by :mod:`specdiff.demo_models.tiny_models` (``build_data``); arrays ``tokens`` (all
sequences concatenated), ``offsets`` [n+1], ``split`` [n] (0 train, 1 held out), ``prompt_lens`` [n].
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

DATA_FILE = "sequences.safetensors"


def load_sequences(path: str | Path, split: str | None = None) -> list[torch.Tensor]:
    """Load the sequences file as a list of int64 token tensors.

    Args:
        path: the ``sequences.safetensors`` file, or the ``data/`` folder holding it.
        split: ``"train"``, ``"heldout"`` or None for all.
    """
    import torch
    from safetensors.numpy import load_file

    path = Path(path)
    if path.is_dir():
        path = path / DATA_FILE
    d = load_file(str(path))
    toks, off, sp = d["tokens"], d["offsets"], d["split"]
    want = {None: None, "train": 0, "heldout": 1}[split]
    return [torch.from_numpy(toks[off[i]:off[i + 1]].astype(np.int64))
            for i in range(len(sp)) if want is None or sp[i] == want]


def load_prompt_lens(path: str | Path, split: str | None = None) -> list[int]:
    """Prompt length (BOS included) of each sequence, in the order of :func:`load_sequences`."""
    from safetensors.numpy import load_file

    path = Path(path)
    if path.is_dir():
        path = path / DATA_FILE
    d = load_file(str(path))
    want = {None: None, "train": 0, "heldout": 1}[split]
    return [int(p) for p, s in zip(d["prompt_lens"], d["split"]) if want is None or s == want]
