"""A model computing at its other precision without a copy: its floating tensors cast in place, their very
originals put back after.

The noise floor (``record train``'s re-run of its forward, replay/record/noise_floor.py) and the diff's
narrowing (the re-run's own noise per row, replay/diff/rerun/noise.py) each run a model once more at the
other precision (``other_dtype``: float32 for a bf16/fp16 model, bf16 for a float32 one). A copy of the
model at float32 is twice its bf16 bytes (the Kimi-K2 draft's 163,840 x 7168 embedding alone: 4.4 GiB).
Here no model is copied: each floating tensor's ``.data`` is replaced by its cast and the original kept,
then put back (the same storage: no rounding, nothing copied back), also when the block raises.

- ``cast_whole``: every floating tensor of the model for the whole block (a model whose forward reads a
  module's dtype outside that module's own forward, as the draft's ``project`` reads fc's:
  replay/model/draft_model.py ``fc_input``).
- ``cast_by_module``: each module's own tensors only while that module runs (a forward pre-hook casts,
  the forward hook restores): the peak is the model plus its largest module at the other dtype, for a
  model whose modules each read only their own tensors (a transformers target).

A lookup table is not cast by ``cast_whole`` (``lookup_tables``): an ``nn.Embedding``'s forward only
gathers rows, and a cast is elementwise, so the rows gathered from the table at its own dtype and then
cast are bit for bit the rows gathered from the cast table (bf16 -> float32 is exact; float32 -> bf16
rounds each element the same either way). Its output is cast instead (a forward hook), so the model
computes exactly what it computes with the table cast, without the table's float32 bytes (Llama-3-8B's
128,256 x 4096: 2.0 GiB). A table read any other way is cast as before: one another module holds (a
tied lm_head), one of a model whose config ties the word embeddings (the draft's tied head reads the
table's weight directly: ``Eagle3Draft.logits``), a subclass (a scaled embedding computes in its
forward) or one with ``max_norm`` (its forward renormalises the table in place).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

__all__ = ["CastError", "HeldCasts", "cast_by_module", "cast_bytes", "cast_whole", "largest_module_bytes",
           "lookup_tables", "other_dtype", "own_tensors", "torch_module", "whole_cast_bytes"]


def other_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a model recorded at ``dtype`` is re-run at: bf16 for float32, float32 for any other."""
    return torch.bfloat16 if dtype == torch.float32 else torch.float32


class CastError(RuntimeError):
    """A tensor that could not be cast in place, or a model without a torch module to cast (one line)."""


class HeldCasts:
    """Floating tensors held at ``dtype`` until restored: each tensor's ``.data`` is replaced by its cast and the
    original kept, then put back as it was. A tensor shared by two modules (a tied embedding) is cast once while
    either holds it."""

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.held: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def cast(self, tensors) -> list[int]:
        """Cast the floating ``tensors`` not at ``dtype`` and not already held; returns their ids (to restore).

        Raises:
            CastError: a tensor refused the cast (everything this call cast stays held: ``restore`` it).
        """
        done = []
        for t in tensors:
            if not t.is_floating_point() or t.dtype == self.dtype or id(t) in self.held:
                continue
            try:
                self.held[id(t)] = (t, t.data)
                t.data = t.data.to(self.dtype)
            except RuntimeError as e:
                self.held.pop(id(t), None)
                raise CastError(f"a {tuple(t.shape)} {t.dtype} tensor cannot be cast to {self.dtype}: {e}") from None
            done.append(id(t))
        return done

    def restore(self, ids=None) -> None:
        """Put back the originals of ``ids`` (``cast``'s return), or of every tensor held."""
        for i in list(self.held) if ids is None else ids:
            t, original = self.held.pop(i)
            t.data = original


def own_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """The parameters and buffers ``module`` holds itself (not its children's)."""
    return [*module.parameters(recurse=False), *module.buffers(recurse=False)]


def torch_module(model) -> torch.nn.Module:
    """The ``nn.Module`` of a target or draft (a trainer's ``TrainerDraft`` wraps its model in ``.model``).

    Raises:
        CastError: neither is an ``nn.Module``.
    """
    if isinstance(model, torch.nn.Module):
        return model
    inner = getattr(model, "model", None)
    if isinstance(inner, torch.nn.Module):
        return inner
    raise CastError(f"{type(model).__name__} holds no torch module to cast")


def lookup_tables(module: torch.nn.Module) -> list[torch.nn.Embedding]:
    """The embeddings of ``module`` read only through their own lookup (module doc): plain ``nn.Embedding``s
    without ``max_norm`` whose weight no other module holds, none where the model's config ties the word
    embeddings."""
    if getattr(getattr(module, "config", None), "tie_word_embeddings", False):
        return []
    holders: dict[int, int] = {}
    for m in module.modules():
        for t in own_tensors(m):
            holders[id(t)] = holders.get(id(t), 0) + 1
    return [m for m in module.modules()
            if type(m) is torch.nn.Embedding and m.max_norm is None and holders[id(m.weight)] == 1]


def _whole_tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    """Every parameter and buffer of ``module`` that ``cast_whole`` casts: all but the lookup tables."""
    tables = {id(m.weight) for m in lookup_tables(module)}
    return [t for t in (*module.parameters(), *module.buffers()) if id(t) not in tables]


@contextmanager
def cast_whole(model, dtype: torch.dtype):
    """``model`` computing at ``dtype`` inside the block: every floating tensor cast in place, a lookup table's
    output instead of its table (module doc), each original put back on exit, also when the block raises.

    Raises:
        CastError: ``model`` holds no torch module, or a tensor could not be cast (everything cast so far is
            restored first).
    """
    module = torch_module(model)
    held = HeldCasts(dtype)
    handles = []
    try:
        held.cast(_whole_tensors(module))
        for table in lookup_tables(module):
            handles.append(table.register_forward_hook(lambda _m, _args, out: out.to(dtype)))
        yield model
    finally:
        for h in handles:
            h.remove()
        held.restore()


@contextmanager
def cast_by_module(module: torch.nn.Module, dtype: torch.dtype):
    """``module`` computing at ``dtype`` inside the block, each of its modules' own floating tensors cast only
    while that module's forward runs and put back after it (also when it raises); the hooks are removed and
    every original is put back on exit.

    Raises:
        CastError: a tensor could not be cast, raised from the forward that cast it.
    """
    held = HeldCasts(dtype)
    stacks: dict[int, list[list[int]]] = {}
    handles = []

    def pre(mod, _args):
        stacks.setdefault(id(mod), []).append(held.cast(own_tensors(mod)))

    def post(mod, _args, _out):
        got = stacks.get(id(mod))
        if got:
            held.restore(got.pop())

    try:
        for m in module.modules():
            if any(t.is_floating_point() for t in own_tensors(m)):
                handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post, always_call=True)]
        yield module
    finally:
        for h in handles:
            h.remove()
        held.restore()


def cast_bytes(tensors, dtype: torch.dtype) -> int:
    """Bytes of the floating ``tensors`` (each once) at ``dtype``."""
    seen = {id(t): t for t in tensors if t.is_floating_point()}
    return sum(t.numel() for t in seen.values()) * torch.empty((), dtype=dtype).element_size()


def whole_cast_bytes(model, dtype: torch.dtype) -> int:
    """What ``cast_whole(model, dtype)`` holds beside the model: its cast tensors' bytes at ``dtype``.

    Raises:
        CastError: ``model`` holds no torch module.
    """
    return cast_bytes(_whole_tensors(torch_module(model)), dtype)


def largest_module_bytes(module: torch.nn.Module, dtype: torch.dtype) -> int:
    """What ``cast_by_module(module, dtype)`` holds beside the model at most: its largest module's own tensors
    at ``dtype``."""
    return max((cast_bytes(own_tensors(m), dtype) for m in module.modules()), default=0)
