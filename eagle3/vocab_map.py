"""The draft -> target vocab map (``d2t`` / ``t2d`` / ``hot_token_id``): what the tensors mean and
what an engine does with them. Every module that reads or checks a vocab map uses these rules.

- ``d2t``: int64 [Vd] *offsets*: target id = draft id + ``d2t[draft id]``.
  SGLang 0.5.23 srt/models/llama_eagle3.py:350-353 (``hot_token_id = d2t + arange(Vd)``, "d2t stores
  diffs between draft id and target id"); vLLM 0.32.0 model_executor/models/llama_eagle3.py:386
  (``targets = base + draft_id_to_target_id``) and :428-430 (``d2t`` loaded as
  ``draft_id_to_target_id``); SpecForge 0.2.0 trains with the same offsets
  (specforge/algorithms/eagle3/model.py:513, ``pred_draft_token_ids + d2t[pred_draft_token_ids]``), and
  speculators 0.9.0 maps draft ids so too (speculators/models/xpress/core.py:95).
- ``hot_token_id``: int64 [Vd], the target id of each draft id, ``d2t + arange(Vd)`` (SGLang).
- ``t2d``: bool [V], True for the target ids the draft vocab covers. Both engines skip it on load
  (SGLang llama_eagle3.py:355-356, vLLM llama_eagle3.py:426-427): only ``d2t`` decides serving.
- no ``d2t``: identity (draft id i is served as target id i).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# The model path (draft forward, recorders, grafts) maps ids on torch tensors: ``hot_token_ids``,
# ``to_target_ids`` and ``d2t_from_target_ids`` import torch when called. Reading a map (``read_d2t``,
# ``t2d_from_d2t``) is numpy, so the pre-flight (``specdiff check``) never imports torch.


def hot_token_ids(d2t):
    """int64 [Vd] torch tensor: the target id of each draft id, ``d2t + arange(Vd)`` (SGLang
    ``hot_token_id``)."""
    import torch

    d2t = d2t.reshape(-1).to(torch.int64)
    return d2t + torch.arange(d2t.shape[0], device=d2t.device)


def to_target_ids(draft_ids, d2t):
    """Draft ids (int64 torch tensor, any shape) -> target ids, ``i + d2t[i]``; identity when ``d2t``
    is None."""
    if d2t is None:
        return draft_ids
    import torch

    return draft_ids + d2t.to(torch.int64)[draft_ids]


def d2t_from_target_ids(target_ids):
    """The ``d2t`` offsets (torch, int64) that serve draft id i as ``target_ids[i]``:
    ``target_ids - arange(Vd)``."""
    import torch

    target_ids = target_ids.reshape(-1).to(torch.int64)
    return target_ids - torch.arange(target_ids.shape[0], device=target_ids.device)


def as_array(x) -> np.ndarray:
    """A vocab-map tensor as a numpy array: a torch tensor (moved to the host; a floating dtype
    numpy has no type for, bf16 or fp8, as float32) or anything ``np.asarray`` takes."""
    if hasattr(x, "detach"):  # torch.Tensor
        t = x.detach().cpu()
        if t.is_floating_point() and t.dtype.itemsize < 4:
            t = t.float()
        return t.numpy()
    return np.asarray(x)


def t2d_from_d2t(d2t, vocab_size: int) -> np.ndarray:
    """bool [V]: True at every target id some draft id maps to (``t2d[d2t + arange] = True``).
    ``d2t``: int offsets [Vd], numpy or torch."""
    d2t = as_array(d2t).reshape(-1).astype(np.int64)
    t2d = np.zeros(vocab_size, dtype=bool)
    t2d[d2t + np.arange(d2t.shape[0])] = True
    return t2d


def _strictly_increasing(x: np.ndarray) -> bool:
    return x.size < 2 or bool((x[1:] > x[:-1]).all())


@dataclass(frozen=True)
class D2TReading:
    """What a ``d2t`` (and optional ``t2d``) says when read the way the engines read it (numpy arrays).

    Attributes:
        d2t: the offsets, int64 [Vd].
        mapped: ``d2t + arange(Vd)``, int64 [Vd]: the target id each draft id is served as.
        vocab_size: V.
        t2d: the mask as bool [V], or None when absent or of the wrong length.
        t2d_size: length of the given ``t2d`` (None when absent).
        in_range: every mapped id is in [0, V).
        is_arange: ``d2t`` equals ``arange(Vd)`` (Vd > 1): as offsets it maps i to 2i.
        direct_valid: ``d2t`` is strictly increasing inside [0, V): it could be direct target ids.
        offsets_match: the mapped ids are exactly the ids ``t2d`` marks.
        direct_match: ``d2t`` itself is exactly the ids ``t2d`` marks (direct ids, not offsets).
        distinct: how many distinct target ids the draft vocab reaches.
    """

    d2t: np.ndarray
    mapped: np.ndarray
    vocab_size: int
    t2d: np.ndarray | None
    t2d_size: int | None
    in_range: bool
    is_arange: bool
    direct_valid: bool
    offsets_match: bool
    direct_match: bool
    distinct: int

    @property
    def looks_direct(self) -> bool:
        """``d2t`` holds direct target ids, not offsets: t2d confirms it, or as offsets it runs
        out of the vocab while as ids it would not."""
        return self.direct_valid and not self.offsets_match and (self.direct_match or not self.in_range)

    @property
    def out_of_range(self) -> np.ndarray:
        """Draft ids (int64) whose mapped target id falls outside [0, V)."""
        return np.flatnonzero((self.mapped < 0) | (self.mapped >= self.vocab_size))


def read_d2t(d2t, t2d=None, *, vocab_size: int) -> D2TReading:
    """Read an integer ``d2t`` [Vd] (and ``t2d`` [V] when given) as offsets, the engines' way.
    Either may be a numpy array or a torch tensor (``as_array``); the reading holds numpy arrays.

    Raises:
        ValueError: ``d2t`` is a floating-point tensor (its values are not ids).
    """
    d2t = as_array(d2t).reshape(-1)
    if d2t.dtype.kind == "f":
        raise ValueError(f"d2t has dtype {d2t.dtype}, expected int64 offsets")
    d2t = d2t.astype(np.int64)
    V, Vd = vocab_size, d2t.size
    ar = np.arange(Vd, dtype=np.int64)
    mapped = d2t + ar
    t2d_size = None if t2d is None else as_array(t2d).size
    mask = as_array(t2d).reshape(-1).astype(bool) if t2d_size == V else None
    t2d_set = None if mask is None else np.flatnonzero(mask)
    direct_valid = Vd > 0 and _strictly_increasing(d2t) and int(d2t.min()) >= 0 and int(d2t.max()) < V
    in_range = Vd == 0 or (int(mapped.min()) >= 0 and int(mapped.max()) < V)
    offsets_match = t2d_set is not None and np.array_equal(np.sort(mapped), t2d_set)
    direct_match = t2d_set is not None and direct_valid and np.array_equal(d2t, t2d_set)
    return D2TReading(d2t=d2t, mapped=mapped, vocab_size=V, t2d=mask, t2d_size=t2d_size, in_range=in_range,
                      is_arange=Vd > 1 and np.array_equal(d2t, ar), direct_valid=direct_valid,
                      offsets_match=offsets_match, direct_match=direct_match,
                      distinct=int(np.unique(mapped).size))
