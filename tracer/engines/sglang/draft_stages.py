"""The draft's inner stages as SGLang serves them: hidden_in, positions, attn_in, hidden_out.

Forward hooks on the modules of the served EAGLE-3 draft (SGLang 0.5.23
``srt/models/llama_eagle3.py``), one set per draft model, read every draft ``ModelRunner.forward``
(prefill draft extend, decode draft extend, each draft step) exactly where the midlayer reads:

===================  ===============================  ==========================================
tensor               module (under the draft model)   what the hook copies
===================  ===============================  ==========================================
``draft.hidden_in``  ``model.layers.0`` (pre)         ``hidden_states`` (3rd argument): fc output
                                                      in a draft extend, the carried hidden in a
                                                      draft step (``spec_info.hidden_states``)
``draft.positions``  ``model.layers.0.self_attn``     keyword ``positions``: what rope rotates at
                     (pre)
``draft.attn_in``    ``model.layers.0.self_attn``     keyword ``hidden_states``:
                     (pre)                            ``cat(input_layernorm(embed), hidden_norm(h))``
                                                      [rows, 2*Hd], after both norms (lines 97-102)
``draft.hidden_out`` ``model.norm`` (post)            output[1]: the pre-norm residual sum the
                                                      final norm returns (lines 263-269), every row
``draft.layer_out.   ``model.layers.{i+1}`` (pre)     ``hidden_states + residual`` (3rd and 5th
{i}``                                                 arguments): layer i's output, which layer
                                                      i+1's ``hidden_norm`` adds up before it
                                                      normalises (lines 103-105); N > 1 layers only
===================  ===============================  ==========================================

Rows come in the forward's own row order (the order of ``forward_batch.input_ids``), so
``attribution`` attributes them like the draft's input ids. Hooks only ``snap`` (a clone, or a
non-blocking copy into pinned memory), never ``.cpu()`` / ``.item()``, and return None: the
server computes exactly what it computes untraced. They do nothing outside a recorded forward
and during CUDA-graph capture; a graph replay runs no Python, so ``graph_hidden`` names what a
graph hides. A module the installed SGLang does not have is reported by ``attach`` (tensor ->
reason) and goes into the contract's ``unrecorded_stages``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from specdiff.tracer.schema import layer_out_name

logger = logging.getLogger("specdiff.tracer")

#: canonical tensor -> dotted module path under the draft ModelRunner's model (LlamaForCausalLMEagle3).
#: SGLang 0.5.23: ``model.layers`` llama_eagle3.py:199 (forward :88), its ``self_attn`` called with
#: keywords at :108 (LlamaAttention.forward, llama.py:264), ``model.norm`` :206 (called at :263).
MODULES: dict[str, str] = {
    "draft.hidden_in": "model.layers.0",
    "draft.positions": "model.layers.0.self_attn",
    "draft.attn_in": "model.layers.0.self_attn",
    "draft.hidden_out": "model.norm",
}
STAGES: tuple[str, ...] = tuple(MODULES)


def _module(model, path: str):
    obj = model
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() and isinstance(obj, torch.nn.ModuleList) else getattr(obj, part, None)
        if obj is None:
            return None
    return obj if isinstance(obj, torch.nn.Module) else None


class DraftStageTaps:
    """Forward hooks that copy the draft midlayer's inputs and output during recorded forwards.

    Args:
        snap: host copy of a device tensor (``hooks.snap``).
        capturing: True while a CUDA graph is being captured (hooks then do nothing).
        on_error: called with (where, exception) when a hook fails; recording stops, serving not.

    Use: ``attach(model)`` once per draft model; ``open()`` before a draft ``ModelRunner.forward``,
    ``close()`` after it returns the copies ``{tensor name: host tensor [rows, ...]}``.
    """

    def __init__(self, *, snap: Callable, capturing: Callable[[], bool],
                 on_error: Callable[[str, BaseException], None]):
        self._snap, self._capturing, self._on_error = snap, capturing, on_error
        self._sink: dict | None = None
        self._hooked: set[int] = set()
        self.unrecorded: dict[str, str] = {}
        #: ``draft.layer_out.{i}`` of each hooked later layer (a CUDA graph replay hides them as it hides STAGES)
        self.layer_outs: tuple[str, ...] = ()

    def attach(self, model) -> dict[str, str]:
        """Register the hooks on ``model`` (idempotent). Returns tensor -> reason for every stage
        whose module this SGLang's draft lacks (also kept in ``unrecorded``)."""
        if id(model) in self._hooked:
            return self.unrecorded
        self._hooked.add(id(model))
        mods = {name: _module(model, path) for name, path in MODULES.items()}
        for name, mod in mods.items():
            if mod is None:
                self.unrecorded[name] = (f"the served draft {type(model).__name__} has no module "
                                         f"{MODULES[name]} (specdiff reads SGLang 0.5.23 llama_eagle3.py)")
        layer, attn, norm = mods["draft.hidden_in"], mods["draft.attn_in"], mods["draft.hidden_out"]
        if layer is not None:
            layer.register_forward_pre_hook(self._layer_pre, with_kwargs=True)
        layers = _module(model, "model.layers")
        for i, later in enumerate(list(layers)[1:] if isinstance(layers, torch.nn.ModuleList) else ()):
            later.register_forward_pre_hook(lambda _m, a, kw, i=i: self._later_pre(i, a, kw), with_kwargs=True)
            self.layer_outs += (layer_out_name(i),)
        if attn is not None:
            attn.register_forward_pre_hook(self._attn_pre, with_kwargs=True)
        if norm is not None:
            norm.register_forward_hook(self._norm_post)
        if self.unrecorded:
            logger.warning("specdiff: not recorded: %s", "; ".join(f"{k}: {v}" for k, v in self.unrecorded.items()))
        return self.unrecorded

    def open(self) -> None:
        """Start collecting for one draft forward."""
        self._sink = {}

    def close(self) -> dict:
        """Stop collecting; the copies of this forward (possibly empty)."""
        sink, self._sink = self._sink, None
        return sink or {}

    # ---- hooks (hot path: copies only) ----------------------------------------------------
    def _put(self, name: str, t) -> None:
        if isinstance(t, torch.Tensor) and name not in self._sink:  # first call of the forward
            self._sink[name] = self._snap(t)

    def _live(self) -> bool:
        return self._sink is not None and not self._capturing()

    def _layer_pre(self, _mod, args, kwargs):
        if not self._live():
            return None
        try:
            # LlamaDecoderLayer.forward(positions, embeds, hidden_states, forward_batch, residual)
            self._put("draft.hidden_in", kwargs["hidden_states"] if "hidden_states" in kwargs else args[2])
        except Exception as exc:  # noqa: BLE001
            self._sink = None
            self._on_error("draft midlayer (hidden_in)", exc)
        return None

    def _later_pre(self, i: int, args, kwargs):
        """Layer i+1's pre-hook: ``draft.layer_out.{i}`` = its ``hidden_states + residual`` (the sum its
        fused ``hidden_norm`` forms, llama_eagle3.py:103-105; one add on the device, the same bf16
        rounding as the fused add's fp32 sum cast back)."""
        if not self._live():
            return None
        try:
            hidden = kwargs["hidden_states"] if "hidden_states" in kwargs else args[2]
            residual = kwargs["residual"] if "residual" in kwargs else args[4]
            self._put(layer_out_name(i), hidden + residual)
        except Exception as exc:  # noqa: BLE001
            self._sink = None
            self._on_error(f"draft decoder layer {i + 1} (layer_out.{i})", exc)
        return None

    def _attn_pre(self, _mod, args, kwargs):
        if not self._live():
            return None
        try:
            # LlamaAttention.forward(positions=..., hidden_states=..., forward_batch=...)
            self._put("draft.positions", kwargs["positions"] if "positions" in kwargs else args[0])
            self._put("draft.attn_in", kwargs["hidden_states"] if "hidden_states" in kwargs else args[1])
        except Exception as exc:  # noqa: BLE001
            self._sink = None
            self._on_error("draft midlayer attention (attn_in, positions)", exc)
        return None

    def _norm_post(self, _mod, _args, out):
        if not self._live():
            return None
        try:
            # RMSNorm(hidden, residual) -> (normed, hidden + residual): the pre-norm midlayer output
            if isinstance(out, tuple) and len(out) == 2:
                self._put("draft.hidden_out", out[1])
        except Exception as exc:  # noqa: BLE001
            self._sink = None
            self._on_error("draft final norm (hidden_out)", exc)
        return None


def graph_hidden(*, draft_decode_graph: bool, draft_extend_graph: bool, layer_outs=()) -> dict[str, str]:
    """Tensor -> reason for the stages a captured CUDA graph hides from these hooks (``STAGES`` and the
    ``layer_outs`` a multi-layer draft's hooks record, ``DraftStageTaps.layer_outs``)."""
    out: dict[str, str] = {}
    if draft_decode_graph:
        for name in (*STAGES, *layer_outs):
            out[name] = ("depth >= 1: the draft steps replay a CUDA graph (no Python hooks run); "
                         "record with SPECDIFF_EAGER_DRAFT=1")
    if draft_extend_graph:
        for name in (*STAGES, *layer_outs):
            reason = ("decode draft extend (depth 0 after verify) replays a CUDA graph; record with "
                      "SPECDIFF_EAGER_DRAFT=1")
            out[name] = f"{out[name]}; {reason}" if name in out else reason
    return out
