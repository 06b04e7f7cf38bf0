"""Forward hooks that read the TTT stage tensors of one trainer forward into a ``TTTOutput``.

Owns which module call is which stage, so every trainer adapter reads its model the same way
(and the same way as ``tracer.training_hooks``, whose roles these are):

==============  =====================================  ==========================================
role            module (SpecForge / speculators)       stage
==============  =====================================  ==========================================
``fc``          ``fc``                                 input -> ``fc_in`` (after the fc norms the
                                                       trainer applies), output -> ``fc_out``
``embed``       ``embed_tokens``                       input ids -> ``tokens`` (first call a depth)
``hidden_norm`` ``midlayer`` / ``layers.0`` .hidden_norm  input -> ``hidden_in`` (first call a depth)
``attn``        ``<layer>.self_attn.q_proj``           input -> ``attn_in``
``norm``        ``norm``                               input -> ``hidden_out`` (pre-norm)
``lm_head``     ``lm_head``                            output -> ``logits``; a call ends the depth
==============  =====================================  ==========================================

``positions`` (the rope position each row's q/k are rotated at) is not the input of any module in
either trainer, so each adapter passes a pre-hook reading it from the call that applies it.
The hooks only read (``detach``); the trainer's forward is unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specdiff.replay.model.draft_model import TTTOutput

__all__ = ["StageHooks", "ROLES"]

ROLES = ("fc", "embed", "hidden_norm", "attn", "norm", "lm_head")
_PER_DEPTH = ("tokens", "hidden_in", "positions", "attn_in", "hidden_out", "logits")


def _out_tensor(x):
    return x[0] if isinstance(x, (tuple, list)) else x


class StageHooks:
    """Hooks on ``model`` collecting one TTT forward's stages; use as a context manager.

    Args:
        model: the trainer's draft module.
        paths: role -> module path (every role of ``ROLES``).
        positions: (module path, fn(args, kwargs) -> int64 positions) read at that module's call,
            once per depth.
        layers: module paths of a multi-layer draft's decoder layers 0..N-2, whose outputs are
            ``draft.layer_out.{i}`` (the last layer's is ``hidden_out``, read at the final norm).

    Raises:
        KeyError: a path names no module of ``model`` (the message names it).
    """

    def __init__(self, model: nn.Module, paths: dict[str, str],
                 positions: tuple[str, Callable] | None = None, layers: tuple[str, ...] = ()):
        mods = dict(model.named_modules())
        missing = [f"{r} ({paths.get(r)})" for r in ROLES if paths.get(r) not in mods]
        missing += [f"layer {i} ({p})" for i, p in enumerate(layers) if p not in mods]
        if missing:
            raise KeyError(f"{type(model).__name__}: no module for {', '.join(missing)}")
        self._mods = {r: mods[paths[r]] for r in ROLES}
        self._layers = [mods[p] for p in layers]
        self._pos = (mods[positions[0]], positions[1]) if positions else None
        self._handles: list = []
        self.reset()

    def reset(self) -> None:
        """Forget what the last forward collected."""
        self.fc_in = self.fc_out = None
        self.depths: list[dict[str, torch.Tensor]] = [{}]

    def _put(self, name: str, t: torch.Tensor) -> None:
        cur = self.depths[-1]
        if name not in cur:  # the first call of a depth is the stage (a norm may run again after)
            cur[name] = t.detach()

    def __enter__(self) -> StageHooks:
        m, reg = self._mods, self._handles.append
        reg(m["fc"].register_forward_pre_hook(lambda _m, a: setattr(self, "fc_in", a[0].detach())))
        reg(m["fc"].register_forward_hook(lambda _m, _a, o: setattr(self, "fc_out", _out_tensor(o).detach())))
        reg(m["embed"].register_forward_pre_hook(lambda _m, a: self._put("tokens", a[0])))
        reg(m["hidden_norm"].register_forward_pre_hook(lambda _m, a: self._put("hidden_in", a[0])))
        reg(m["attn"].register_forward_pre_hook(lambda _m, a: self._put("attn_in", a[0])))
        reg(m["norm"].register_forward_pre_hook(lambda _m, a: self._put("hidden_out", a[0])))
        reg(m["lm_head"].register_forward_hook(self._lm_out))
        for i, layer in enumerate(self._layers):
            reg(layer.register_forward_hook(lambda _m, _a, o, i=i: self._put(f"layer_out.{i}", _out_tensor(o))))
        if self._pos is not None:
            mod, fn = self._pos
            reg(mod.register_forward_pre_hook(lambda _m, a, kw: self._put("positions", fn(a, kw)),
                                              with_kwargs=True))
        return self

    def _lm_out(self, _m, _a, out) -> None:
        self._put("logits", _out_tensor(out))
        self.depths.append({})

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def output(self, lengths: torch.Tensor, d2t: torch.Tensor,
               unpack: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> TTTOutput:
        """The collected stages as a ``TTTOutput`` over the padded [B, T] batch of ``lengths``.

        ``unpack`` turns a collected tensor into [B, T, ...] (a packed trainer's [1, N, ...]);
        validity is the reference's (row t at depth k: t + 1 + k < length, tracer/rows.py).

        Raises:
            RuntimeError: the forward did not run fc, or a depth misses a stage (named).
        """
        depths = [d for d in self.depths if d]
        if self.fc_in is None or not depths:
            raise RuntimeError("the trainer's forward did not run the draft's fc / lm_head")
        layer_outs = [f"layer_out.{i}" for i in range(len(self._layers))]
        for k, d in enumerate(depths):
            lacking = [n for n in (*_PER_DEPTH, *layer_outs) if n not in d]
            if lacking:
                raise RuntimeError(f"depth {k}: the trainer's forward did not run {', '.join(lacking)}")
        lengths = lengths.to(torch.int64).cpu()
        fc_in = unpack(self.fc_in)
        T = fc_in.shape[1]
        ar = torch.arange(T)[None, :]
        dev = fc_in.device
        res = {n: [unpack(d[n]) for d in depths] for n in _PER_DEPTH}
        res["tokens"] = [t.to(torch.int64) for t in res["tokens"]]
        res["positions"] = [p.to(torch.int64).expand(len(lengths), T) for p in res["positions"]]
        valid = [(ar + 1 + k < lengths[:, None]).to(dev) for k in range(len(depths))]
        res["layer_out"] = [[unpack(d[n]) for n in layer_outs] for d in depths]
        return TTTOutput(fc_in=fc_in, fc_out=unpack(self.fc_out), valid=valid, lengths=lengths, d2t=d2t, **res)
