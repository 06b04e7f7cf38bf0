"""The draft -> target vocab map (``d2t`` / ``t2d`` / ``hot_token_id``): what the tensors mean and
what an engine does with them. Every module that reads or checks a vocab map uses these rules.

- ``d2t``: int64 [Vd] *offsets*: target id = draft id + ``d2t[draft id]``.
  SGLang 0.5.23 srt/models/llama_eagle3.py:350-353 (``hot_token_id = d2t + arange(Vd)``, "d2t stores
  diffs between draft id and target id"); vLLM 0.32.0 model_executor/models/llama_eagle3.py:386
  (``targets = base + draft_id_to_target_id``) and :428-430 (``d2t`` loaded as
  ``draft_id_to_target_id``); SpecForge / speculators write it the same way
  (shared/research/training-side.md).
- ``hot_token_id``: int64 [Vd], the target id of each draft id, ``d2t + arange(Vd)`` (SGLang).
- ``t2d``: bool [V], True for the target ids the draft vocab covers. Both engines skip it on load
  (SGLang llama_eagle3.py:355-356, vLLM llama_eagle3.py:426-427): only ``d2t`` decides serving.
- no ``d2t``: identity (draft id i is served as target id i).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def hot_token_ids(d2t: torch.Tensor) -> torch.Tensor:
    """int64 [Vd]: the target id of each draft id, ``d2t + arange(Vd)`` (SGLang ``hot_token_id``)."""
    d2t = d2t.reshape(-1).to(torch.int64)
    return d2t + torch.arange(d2t.shape[0], device=d2t.device)


def to_target_ids(draft_ids: torch.Tensor, d2t: torch.Tensor | None) -> torch.Tensor:
    """Draft ids (int64, any shape) -> target ids, ``i + d2t[i]``; identity when ``d2t`` is None."""
    if d2t is None:
        return draft_ids
    return draft_ids + d2t.to(torch.int64)[draft_ids]


def d2t_from_target_ids(target_ids: torch.Tensor) -> torch.Tensor:
    """The ``d2t`` offsets that serve draft id i as ``target_ids[i]``: ``target_ids - arange(Vd)``."""
    target_ids = target_ids.reshape(-1).to(torch.int64)
    return target_ids - torch.arange(target_ids.shape[0], device=target_ids.device)


def t2d_from_d2t(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [V]: True at every target id some draft id maps to (``t2d[d2t + arange] = True``)."""
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[hot_token_ids(d2t)] = True
    return t2d


def _strictly_increasing(x: torch.Tensor) -> bool:
    return x.numel() < 2 or bool((x[1:] > x[:-1]).all())


@dataclass(frozen=True)
class D2TReading:
    """What a ``d2t`` (and optional ``t2d``) says when read the way the engines read it.

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

    d2t: torch.Tensor
    mapped: torch.Tensor
    vocab_size: int
    t2d: torch.Tensor | None
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
    def out_of_range(self) -> torch.Tensor:
        """Draft ids (int64) whose mapped target id falls outside [0, V)."""
        return torch.nonzero((self.mapped < 0) | (self.mapped >= self.vocab_size)).reshape(-1)


def read_d2t(d2t: torch.Tensor, t2d: torch.Tensor | None = None, *, vocab_size: int) -> D2TReading:
    """Read an integer ``d2t`` [Vd] (and ``t2d`` [V] when given) as offsets, the engines' way.

    Raises:
        ValueError: ``d2t`` is a floating-point tensor (its values are not ids).
    """
    d2t = d2t.reshape(-1)
    if d2t.is_floating_point():
        raise ValueError(f"d2t has dtype {d2t.dtype}, expected int64 offsets")
    d2t = d2t.to(torch.int64)
    V, Vd = vocab_size, d2t.numel()
    ar = torch.arange(Vd)
    mapped = d2t + ar
    t2d_size = None if t2d is None else t2d.numel()
    mask = t2d.reshape(-1).to(torch.bool) if t2d is not None and t2d.numel() == V else None
    t2d_set = None if mask is None else torch.nonzero(mask).reshape(-1)
    direct_valid = Vd > 0 and _strictly_increasing(d2t) and int(d2t.min()) >= 0 and int(d2t.max()) < V
    in_range = Vd == 0 or (int(mapped.min()) >= 0 and int(mapped.max()) < V)
    offsets_match = t2d_set is not None and torch.equal(torch.sort(mapped).values, t2d_set)
    direct_match = t2d_set is not None and direct_valid and torch.equal(d2t, t2d_set)
    return D2TReading(d2t=d2t, mapped=mapped, vocab_size=V, t2d=mask, t2d_size=t2d_size, in_range=in_range,
                      is_arange=Vd > 1 and torch.equal(d2t, ar), direct_valid=direct_valid,
                      offsets_match=offsets_match, direct_match=direct_match,
                      distinct=int(torch.unique(mapped).numel()))
