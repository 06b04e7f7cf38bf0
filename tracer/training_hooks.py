"""Record canonical EAGLE-3 tensors from a user's own training loop, with torch hooks.

Torch only (no transformers, no replay): importable anywhere the tracer is.

    from specdiff.tracer.store import TraceWriter
    from specdiff.tracer.training_hooks import attach_recorder

    writer = TraceWriter("train.trace", side="train")
    rec = attach_recorder(draft, writer)                 # adapter "auto": SpecForge / speculators / reference
    for seq_ids, batch in loader:
        rec.batch(seq_ids, batch["lengths"], tokens=batch["input_ids"])  # keys for the next forward
        loss = train_step(draft, batch)                  # the TTT forward, unchanged
    rec.detach(); writer.close()

What is read where (``name_map`` roles; every EAGLE-3 draft in SpecForge, speculators and
specdiff's reference has these modules):

=============  =======================  ============================================
role           default module           canonical tensor
=============  =======================  ============================================
``fc``         ``fc``                   input -> ``draft.fc_in`` (and ``target.aux_cat`` /
                                        ``target.aux.{j}`` when no input norm), output ->
                                        ``draft.fc_out``; a call starts a new TTT forward
``input_norm`` ``input_norm`` (if any)  input -> ``target.aux_cat`` / ``target.aux.{j}``
``embed``      ``embed_tokens``         input ids -> ``tokens`` at the current depth
``hidden_norm`` ``<layer>.hidden_norm`` input -> ``draft.hidden_in`` (first call per depth)
``attn``       ``<layer>.self_attn.q_proj`` input -> ``draft.attn_in``
``rope``       reference: ``midlayer.      first input (the positions the attention rotates
               self_attn.rotary_emb``      at) -> ``draft.positions``; optional, and only in
                                        the reference map: SpecForge's and speculators'
                                        ``rotary_emb`` take values and add the TTT step
                                        inside, so name a module whose first input *is* the
                                        rope positions
``layer_out.{i}`` ``layers.{i+1}.hidden_norm`` first input a depth -> ``draft.layer_out.{i}`` (decoder
               (``input_layernorm``     layer i's output, i < N-1, of an N-layer draft: the next
               where the layer has no   layer's input norm reads it whole; SGLang's layers.{i+1}
               hidden_norm: speculators) hidden_norm, speculators' plain decoder layer's
                                        input_layernorm, models/eagle3/core.py:81-94)
``norm``       ``norm``                 input -> ``draft.hidden_out`` (pre-norm)
``lm_head``    ``lm_head``              output -> logits (top-k + logsumexp, or full), ``draft.topk``,
                                        ``draft.topk_target`` (through the model's ``d2t``);
                                        a call ends the current depth
=============  =======================  ============================================

``<layer>`` is ``midlayer`` (SpecForge ``LlamaForCausalLMEagle3`` and the reference) or
``layers.0`` (speculators ``Eagle3DraftModel``); a SpecForge ``OnlineEagle3Model`` is found
through its ``draft_model.`` prefix. Depth k counts the ``lm_head`` calls since the last ``fc``
call, so each TTT step's tensors get depth k. Rows are keyed with the batch the caller declares
(``Recorder.batch``): row (b, t) -> (seq_ids[b], t), or, for packed [1, sum(lengths)] layouts,
the position inside its sequence. Only rows the EAGLE-3 pairing defines are written: t < length
at depth 0 (fc tensors), t + 1 + k < length at depth k (the EAGLE-3 position pairing, tracer/rows.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from specdiff.eagle3.vocab_map import hot_token_ids
from specdiff.tracer.contract import sha256_array
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.rows import AcceptChain, RowLayout, draft_outputs
from specdiff.tracer.schema import aux_name, layer_out_index

__all__ = ["HookError", "Recorder", "attach_recorder", "ADAPTERS", "resolve_name_map"]

ROLES = ("fc", "input_norm", "embed", "hidden_norm", "attn", "rope", "norm", "lm_head")
_REQUIRED = ("fc", "embed", "hidden_norm", "attn", "norm", "lm_head")


def _layer_role(role: str) -> int | None:
    """The decoder layer of a name map's ``layer_out.{i}`` role (``draft.layer_out.{i}``), else None."""
    return layer_out_index(f"draft.{role}")

_LEVELS = {"topk": "default", "full": "full", "none": "none"}  # logits= -> tracer.rows level


class HookError(SpecdiffError):
    """A model the recorder cannot attach to (one line naming the missing modules)."""


def _layer_map(model: nn.Module, prefix: str, layer: str) -> dict[str, str]:
    return {"fc": f"{prefix}fc", "input_norm": f"{prefix}input_norm", "embed": f"{prefix}embed_tokens",
            "hidden_norm": f"{prefix}{layer}.hidden_norm", "attn": f"{prefix}{layer}.self_attn.q_proj",
            "norm": f"{prefix}norm", "lm_head": f"{prefix}lm_head", **_later_layers(model, prefix)}


def _later_layers(model: nn.Module, prefix: str) -> dict[str, str]:
    """``layer_out.{i}`` -> the input norm of decoder layer i+1 (module doc), for each later layer found."""
    names = dict(model.named_modules())
    out, i = {}, 0
    while True:
        p = f"{prefix}layers.{i + 1}"
        norm = next((n for n in (f"{p}.hidden_norm", f"{p}.input_layernorm") if n in names), None)
        if norm is None:
            return out
        out[f"layer_out.{i}"] = norm
        i += 1


#: adapter name -> callable(model) -> name map (role -> module path)
ADAPTERS = {
    "reference": lambda m: {**_layer_map(m, "", "midlayer"), "rope": "midlayer.self_attn.rotary_emb"},
    "specforge": lambda m: _layer_map(m, _prefix(m), "midlayer"),
    "speculators": lambda m: _layer_map(m, _prefix(m), "layers.0"),
}


def _prefix(model: nn.Module) -> str:
    """'' or the dotted path of the submodule holding ``fc`` and ``lm_head`` (e.g. ``draft_model.``)."""
    names = dict(model.named_modules())
    for name in sorted(names, key=len):
        p = f"{name}." if name else ""
        if f"{p}fc" in names and f"{p}lm_head" in names:
            return p
    return ""


def resolve_name_map(model: nn.Module, adapter="auto") -> tuple[str, dict[str, str]]:
    """(adapter name, role -> module path) for ``model``.

    ``adapter``: ``"auto"`` (SpecForge/reference ``midlayer`` or speculators ``layers.0``, under any
    prefix), an adapter name from ``ADAPTERS``, or a mapping role -> module path (missing roles take
    the ``auto`` defaults).
    """
    names = dict(model.named_modules())
    if isinstance(adapter, Mapping):
        unknown = sorted(r for r in adapter if r not in ROLES and _layer_role(r) is None)
        if unknown:
            raise HookError(f"name map roles {unknown} are unknown; roles: {', '.join(ROLES)}, layer_out.{{i}}")
        base = resolve_name_map(model, "auto")[1] if not all(r in adapter for r in _REQUIRED) else {}
        return "name_map", {**base, **dict(adapter)}
    if adapter == "auto":
        p = _prefix(model)
        layer = "midlayer" if f"{p}midlayer" in names else "layers.0"
        kind = "speculators" if layer == "layers.0" else ("specforge" if p or type(model).__name__ != "Eagle3Draft"
                                                         else "reference")
        return kind, (ADAPTERS["reference"](model) if kind == "reference" else _layer_map(model, p, layer))
    if adapter not in ADAPTERS:
        raise HookError(f"unknown adapter {adapter!r}; use auto, {', '.join(ADAPTERS)} or a name map")
    return adapter, ADAPTERS[adapter](model)


def _first_tensor(x):
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (tuple, list)) and x and isinstance(x[0], torch.Tensor):
        return x[0]
    return getattr(x, "logits", None)


class Recorder:
    """Hooks on a draft model that write canonical tensors to a ``TraceWriter``.

    Create with ``attach_recorder``. Call ``batch(...)`` before each forward; ``detach()`` removes
    every hook (the model is left exactly as it was). Recording runs under ``torch.no_grad`` on
    detached copies and never changes what the model computes.

    Attributes:
        adapter: the adapter used; name_map: role -> module path; records: rows appended.
    """

    def __init__(self, model: nn.Module, writer, adapter, name_map: dict[str, str], *, topk: int = 1,
                 logits: str = "topk", logits_topk: int = 8, num_aux: int | None = None):
        if logits not in ("topk", "full", "none"):
            raise HookError(f"logits={logits!r}: use topk, full or none")
        self.model, self.writer, self.adapter, self.name_map = model, writer, adapter, dict(name_map)
        self.topk, self.logits, self.logits_topk = topk, logits, logits_topk
        self._handles: list = []
        self._layout: RowLayout | None = None
        self._depth = 0
        self._seen: set[tuple[str, int]] = set()
        self._argmax: torch.Tensor | None = None
        self._chain: AcceptChain | None = None
        self.records = 0
        self.max_depth = -1
        names = dict(model.named_modules())
        missing = [f"{r} ({p})" for r, p in self.name_map.items()
                   if (r in _REQUIRED or _layer_role(r) is not None) and p not in names]
        if missing:
            raise HookError(f"{type(model).__name__}: modules not found for {', '.join(missing)}; "
                            "pass adapter= a name map role -> module path")
        self._mods = {r: names[p] for r, p in self.name_map.items() if p in names}
        fc = self._mods["fc"]
        cfg = getattr(model, "config", None) or getattr(getattr(model, "draft_model", None), "config", None)
        k = num_aux or getattr(cfg, "num_aux", None) or getattr(cfg, "num_aux_hidden_states", None) or 3
        self.num_aux = int(k)
        self.aux_width = int(getattr(fc, "in_features", 0)) or None
        self._d2t = self._find_buffer("d2t")
        self._attach()
        self._set_facts()

    # ---- setup ------------------------------------------------------------------------------
    def _find_buffer(self, name: str):
        for n, b in self.model.named_buffers():
            if n == name or n.endswith("." + name):
                return b
        return None

    def _set_facts(self) -> None:
        lm = self._mods["lm_head"]
        facts = {"engine": f"training-hooks:{self.adapter}", "spec_topk": int(self.topk),
                 "capture_level": "full" if self.logits == "full" else "default",
                 "logits_topk": int(self.logits_topk) if self.logits == "topk" else 0}
        if hasattr(lm, "out_features"):
            facts["draft_vocab_size"] = int(lm.out_features)
            facts["draft_hidden_size"] = int(lm.in_features)
        if self._d2t is not None:
            d2t = self._d2t.detach().cpu().to(torch.int64)
            facts["d2t_sha256"] = sha256_array(d2t)
            facts["hot_token_id_sha256"] = sha256_array(hot_token_ids(d2t))
        facts["norm_before_fc"] = "input_norm" in self._mods
        facts["name_map"] = dict(self.name_map)
        self.writer.set_contract(**{k: v for k, v in facts.items() if k not in self.writer.contract})

    def _attach(self) -> None:
        m = self._mods
        reg = self._handles.append
        reg(m["fc"].register_forward_pre_hook(self._fc_pre))
        reg(m["fc"].register_forward_hook(self._fc_out))
        if "input_norm" in m:
            reg(m["input_norm"].register_forward_pre_hook(self._aux_pre))
        reg(m["embed"].register_forward_pre_hook(self._embed_pre))
        reg(m["hidden_norm"].register_forward_pre_hook(self._hidden_pre))
        reg(m["attn"].register_forward_pre_hook(self._attn_pre))
        if "rope" in m:
            reg(m["rope"].register_forward_pre_hook(self._rope_pre))
        reg(m["norm"].register_forward_pre_hook(self._norm_pre))
        for role in m:
            if _layer_role(role) is not None:
                name = f"draft.{role}"
                reg(m[role].register_forward_pre_hook(lambda _m, a, name=name: self._layer_out(name, a[0])))
        reg(m["lm_head"].register_forward_hook(self._lm_out))

    # ---- public -----------------------------------------------------------------------------
    def batch(self, seq_ids, lengths, *, packed: bool = False, target_argmax=None, tokens=None) -> None:
        """Declare the batch of the next forward.

        Args:
            seq_ids: [B] trace sequence ids of the batch rows (register the token sequences with
                ``writer.add_sequence``; ``tokens`` does it for you).
            lengths: [B] valid lengths (right padding).
            packed: tensors are [1, sum(lengths), ...] (sequences back to back), not [B, T, ...].
            target_argmax: optional [B, T] (or packed [sum]) target greedy ids: writes
                ``target.argmax`` and per-depth ``draft.accept`` / ``draft.accept_cum``.
            tokens: optional [B, T] token ids to register as the sequences ``seq_ids``.
        """
        seq_ids = np.asarray(torch.as_tensor(seq_ids).cpu(), dtype=np.int64).reshape(-1)
        lengths = np.asarray(torch.as_tensor(lengths).cpu(), dtype=np.int64).reshape(-1)
        if len(seq_ids) != len(lengths):
            raise HookError(f"batch: {len(seq_ids)} seq ids but {len(lengths)} lengths")
        if packed:
            self._layout = RowLayout.packed(seq_ids, lengths)
        else:
            T = int(lengths.max()) if tokens is None else max(int(torch.as_tensor(tokens).shape[-1]),
                                                                int(lengths.max()))
            self._layout = RowLayout.padded(seq_ids, lengths, T)
        if tokens is not None:
            starts = np.cumsum(lengths) - lengths
            tk = torch.as_tensor(tokens).cpu()
            for b, (sid, n) in enumerate(zip(seq_ids, lengths, strict=True)):
                row = tk.reshape(-1)[starts[b]:starts[b] + n] if packed else tk[b, :n]
                self.writer.add_sequence(row.numpy(), seq_id=int(sid))
        self._argmax = None
        if target_argmax is not None:
            a = torch.as_tensor(target_argmax).detach().cpu().to(torch.int64).reshape(-1)
            self._argmax = self._layout.flat(a, 0)
            sel = self._layout.defined(None)
            self._write("target.argmax", self._argmax[torch.as_tensor(sel)], sel, 0)
        self._depth = 0
        self._seen.clear()
        self._chain = None

    def detach(self) -> None:
        """Remove every hook this recorder added; the model is unchanged."""
        for h in self._handles:
            h.remove()
        self._handles.clear()
        if self.max_depth >= 0 and not self.writer.closed and "spec_steps" not in self.writer.contract:
            self.writer.set_contract(spec_steps=self.max_depth + 1)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.detach()

    # ---- rows -------------------------------------------------------------------------------
    def _write(self, name: str, values: torch.Tensor, sel: np.ndarray, depth: int) -> None:
        if len(sel) == 0:
            return
        lay = self._layout
        self.writer.append(name, values, seq=lay.seq[sel], pos=lay.pos[sel], depth=depth)
        self.records += 1

    def _once(self, role: str) -> bool:
        key = (role, self._depth)
        if key in self._seen:
            return False
        self._seen.add(key)
        return True

    def _record(self, name: str, t: torch.Tensor, feat_dims: int, depth: int | None) -> None:
        if self._layout is None:
            return
        sel = self._layout.defined(depth)
        self._write(name, self._layout.take(t, sel, feat_dims), sel, 0 if depth is None else depth)

    # ---- hooks ------------------------------------------------------------------------------
    @torch.no_grad()
    def _fc_pre(self, module, args):
        self._depth = 0
        self._seen.clear()
        self._chain = None
        x = args[0]
        if "input_norm" not in self._mods:
            self._aux(x)
        self._record("draft.fc_in", x, 1, None)

    @torch.no_grad()
    def _aux_pre(self, module, args):
        if self._once("aux"):
            self._aux(args[0])

    def _aux(self, x: torch.Tensor) -> None:
        self._record("target.aux_cat", x, 1, None)
        if x.shape[-1] % self.num_aux == 0:
            for j, chunk in enumerate(x.chunk(self.num_aux, dim=-1)):
                self._record(aux_name(j), chunk, 1, None)

    @torch.no_grad()
    def _fc_out(self, module, args, out):
        self._record("draft.fc_out", out, 1, None)

    @torch.no_grad()
    def _embed_pre(self, module, args):
        if self._once("embed"):
            self._record("tokens", args[0], 0, self._depth)
            if self._depth:  # the ids the trainer's embedding read at depth >= 1 (schema draft.input_ids)
                self._record("draft.input_ids", args[0], 0, self._depth)

    @torch.no_grad()
    def _hidden_pre(self, module, args):
        if self._once("hidden_in"):
            self._record("draft.hidden_in", args[0], 1, self._depth)

    @torch.no_grad()
    def _attn_pre(self, module, args):
        if self._once("attn_in"):
            self._record("draft.attn_in", args[0], 1, self._depth)

    @torch.no_grad()
    def _rope_pre(self, module, args):
        if self._once("positions"):
            self._record("draft.positions", args[0].to(torch.int64), 0, self._depth)

    @torch.no_grad()
    def _layer_out(self, name: str, x: torch.Tensor) -> None:
        if self._once(name):
            self._record(name, x, 1, self._depth)

    @torch.no_grad()
    def _norm_pre(self, module, args):
        if self._once("hidden_out"):
            self._record("draft.hidden_out", args[0], 1, self._depth)

    @torch.no_grad()
    def _lm_out(self, module, args, out):
        d = self._depth
        logits = _first_tensor(out)
        if logits is not None and self._layout is not None:
            lay = self._layout
            sel = lay.defined(d)
            label = None
            if self._argmax is not None:
                self._chain = self._chain or AcceptChain(lay.rows)
                label = self._argmax[torch.as_tensor(lay.label_index(sel, d))]
            # the live d2t buffer at this call (a loaded checkpoint may have replaced it)
            hot = None if self._d2t is None else hot_token_ids(self._d2t.detach().cpu())
            outs = draft_outputs(lay.take(logits, sel, 1), level=_LEVELS[self.logits], logits_topk=self.logits_topk,
                                 topk=self.topk, hot_token_id=hot, label=label, chain=self._chain, idx=sel)
            for name, v in outs.items():
                self._write(name, v, sel, d)
            self.max_depth = max(self.max_depth, d)
        self._depth += 1


def attach_recorder(model: nn.Module, writer, *, adapter="auto", topk: int = 1, logits: str = "topk",
                    logits_topk: int = 8, num_aux: int | None = None) -> Recorder:
    """Attach a ``Recorder`` to an EAGLE-3 draft model (see the module doc).

    Args:
        model: SpecForge ``OnlineEagle3Model`` / ``LlamaForCausalLMEagle3``, speculators
            ``Eagle3DraftModel``, specdiff's ``Eagle3Draft``, or any module with a name map.
        writer: an open ``TraceWriter`` (side ``"train"``).
        adapter: ``"auto"``, ``"specforge"``, ``"speculators"``, ``"reference"`` or a mapping
            role -> module path (roles: fc, input_norm, embed, hidden_norm, attn, norm, lm_head, and
            ``layer_out.{i}``: the module whose first input a depth is decoder layer i's output).
        topk: width of ``draft.topk``; logits: ``"topk"`` (top ``logits_topk`` + logsumexp),
            ``"full"`` or ``"none"``; num_aux: K aux slots (default: the model config's, else 3).

    Raises:
        HookError: a required module is missing (named), or bad arguments.
    """
    kind, name_map = resolve_name_map(model, adapter)
    return Recorder(model, writer, kind, name_map, topk=topk, logits=logits, logits_topk=logits_topk,
                    num_aux=num_aux)
