"""The canonical EAGLE-3 trace schema: the one place that names every recorded tensor.

Every tensor a recorder writes (SGLang plugin, training hooks, reference replay) and every
tensor the diff reads is a ``TensorSpec`` from this module. A tensor belongs to a *stage* of
the EAGLE-3 dataflow; ``STAGE_ORDER`` is the order in which "first divergence" is judged.

Rows are keyed by ``(seq, pos, depth, iter)``:

- ``seq``   int32, index into the trace's sequence table;
- ``pos``   int32, position t. EAGLE-3 pairing (SGLang draft-extend, SpecForge, speculators):
            the draft row at t consumes (target aux hidden state h_t, token x_{t+1}) and
            predicts x_{t+2}. At draft depth (TTT step) k the input token is x_{t+1+k};
  ``target.*`` rows at t are the target's view of position t (h_t; argmax = x_{t+1} if greedy).
- ``depth`` int16, draft depth / TTT step k (0 for target rows);
- ``iter``  int32, serving decode iteration (-1 on the training side and for prefill-only rows).

Verify rows (``verify.*``) are keyed by the committed sequence length ``pos`` at the verify
step, ``depth`` 0 and the decode ``iter``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kind = Literal["float", "int", "bool"]

#: Stage names in dataflow order. "First divergence" = earliest stage here, then earliest pos.
STAGE_ORDER: tuple[str, ...] = (
    "tokens",
    "target.aux",
    "target.aux_cat",
    "draft.fc_in",
    "draft.fc_out",
    "draft.positions",
    "draft.attn_in",
    "draft.hidden_out",
    "draft.logits",
    "draft.topk",
    "draft.topk_target",
    "verify",
)


@dataclass(frozen=True)
class TensorSpec:
    """One canonical tensor.

    Attributes:
        name: canonical name, e.g. ``"draft.fc_out"``; ``"target.aux.{j}"`` is a template
            for aux slot j (``spec_for("target.aux.2")`` resolves it).
        stage: the stage in ``STAGE_ORDER`` this tensor belongs to.
        dims: names of the per-row feature dimensions (the leading ``row`` dim is implicit).
            Sizes come from the contract facts: ``hidden`` = target H, ``aux_hidden`` = K*H,
            ``draft_hidden`` = Hd, ``attn_in`` = 2*Hd, ``draft_vocab`` = Vd, ``topk`` = the
            speculative topk, ``logits_topk`` = capture level's k, ``draft_tokens`` = N,
            ``accept_slots`` = steps + 1.
        kind: dtype family. ``float`` tensors keep their recorded dtype (bf16 stored as raw
            uint16 bits, see traces/FORMAT.md); ``int`` are int64 ids; ``bool`` flags.
        by_depth: True when rows exist for draft depths k > 0.
        doc: what the tensor is, with the convention's source.
    """

    name: str
    stage: str
    dims: tuple[str, ...]
    kind: Kind
    by_depth: bool
    doc: str

    @property
    def stage_index(self) -> int:
        return STAGE_ORDER.index(self.stage)


_SPECS: tuple[TensorSpec, ...] = (
    TensorSpec("tokens", "tokens", (), "int", True,
               "Draft input token at (t, k): x_{t+1+k} (EAGLE-3 position pairing)."),
    TensorSpec("draft.input_ids", "tokens", (), "int", True,
               "The token id the draft was fed at depth k >= 1 (its embedding's input), every row the "
               "engine ran (every tree branch, in the rows' order), in the vocabulary the contract's "
               "draft_input_ids_vocab names. Serving: the engine's own draft-step input, SGLang 0.5.23 "
               "after the hot_token_id map (eagle_worker_v2.py:757-758, :897-898: target ids), vLLM 0.32.0 "
               "the previous step's draft token (target ids); training: the teacher-forced x_{t+1+k} its "
               "forward embeds. Its rope position is draft.positions of the same row."),
    TensorSpec("target.aux.{j}", "target.aux", ("hidden",), "float", False,
               "Aux hidden state slot j at position t, as fed to the draft. Slot j is the j-th "
               "captured layer in ascending layer order (SGLang aux_hidden_states.py concat order)."),
    TensorSpec("target.probe.{i}", "target.aux", ("hidden",), "float", False,
               "HF output_hidden_states[i] at position t, recorded for layer identification "
               "(record train --probe-layers): lets explain name the layer a slot really holds."),
    TensorSpec("target.aux_cat", "target.aux_cat", ("aux_hidden",), "float", False,
               "Concatenation of the aux slots, [K*H] (SGLang logits_output.hidden_states)."),
    TensorSpec("target.argmax", "verify", (), "int", False,
               "Target's greedy next-token id after position t (predicts x_{t+1})."),
    TensorSpec("target.logits_topk.values", "verify", ("logits_topk",), "float", False,
               "Top logits_topk target logits after position t, descending, float32 (training: the "
               "HF forward's logits; SGLang: LogitsProcessorOutput.next_token_logits of the prefill "
               "and verify forwards; vLLM: the sampler's logits): a greedy flip at a near tie of "
               "the target's own logits is told from a different target by them."),
    TensorSpec("target.logits_topk.ids", "verify", ("logits_topk",), "int", False,
               "Target-vocab ids of target.logits_topk.values."),
    TensorSpec("draft.fc_in", "draft.fc_in", ("aux_hidden",), "float", False,
               "Input of the draft fc after optional norm_before_fc / fc_norm (else = aux_cat)."),
    TensorSpec("draft.fc_out", "draft.fc_out", ("draft_hidden",), "float", False,
               "Draft fc output: the hidden fed to the midlayer at depth 0."),
    TensorSpec("draft.hidden_in", "draft.fc_out", ("draft_hidden",), "float", True,
               "Hidden fed to the midlayer at depth k: fc_out at k=0, the draft's own pre-norm "
               "output of depth k-1 after (SpecForge/speculators/SGLang feedback)."),
    TensorSpec("draft.positions", "draft.positions", (), "int", True,
               "Rope position the midlayer's attention gives row (t, k): t + k (SGLang draft extend "
               "uses the ordinary positions, draft steps seq_lens + k - 1, advanced by "
               "``positions.add_(1)``, eagle_worker_v2.py; SpecForge/speculators TTT: t + k)."),
    TensorSpec("draft.attn_in", "draft.attn_in", ("attn_in",), "float", True,
               "Midlayer attention input concat(input_layernorm(embed x), hidden_norm(h)), [2*Hd]: "
               "the embedding half [:Hd] then the hidden half [Hd:] (SGLang llama_eagle3.py:97-102, "
               "the qkv input after both norms)."),
    TensorSpec("draft.layer_out.{i}", "draft.hidden_out", ("draft_hidden",), "float", True,
               "Output of decoder layer i of a draft with N > 1 layers, for i < N-1 (the last layer's "
               "is draft.hidden_out): the residual sum the next layer normalises with its hidden_norm "
               "(SGLang llama_eagle3.py:103-105, :253-262, the layer's (hidden, residual) summed). "
               "Sorts before draft.hidden_out: a divergence in layer i is shown at its own output."),
    TensorSpec("draft.hidden_out", "draft.hidden_out", ("draft_hidden",), "float", True,
               "Midlayer output before the final norm (SGLang llama_eagle3.py returns this); with "
               "N > 1 decoder layers the last layer's output."),
    TensorSpec("draft.logits", "draft.logits", ("draft_vocab",), "float", True,
               "Full draft logits over the draft vocab (capture level 'full' only)."),
    TensorSpec("draft.logits_topk.values", "draft.logits", ("logits_topk",), "float", True,
               "Top logits_topk draft logits, descending."),
    TensorSpec("draft.logits_topk.ids", "draft.logits", ("logits_topk",), "int", True,
               "Draft-vocab ids of draft.logits_topk.values."),
    TensorSpec("draft.logsumexp", "draft.logits", (), "float", True,
               "logsumexp of the full draft logits (so top-k values give log-probs)."),
    TensorSpec("draft.topk", "draft.topk", ("topk",), "int", True,
               "Draft top-k token ids in the draft vocab (SGLang topk_index before mapping)."),
    TensorSpec("draft.topk_target", "draft.topk_target", ("topk",), "int", True,
               "draft.topk mapped to target ids: hot_token_id[i] = i + d2t[i] (SGLang "
               "llama_eagle3.py; t2d is ignored)."),
    TensorSpec("draft.d2t", "draft.topk_target", (), "int", False,
               "The vocab map as used: row pos=i holds d2t[i] (offset: target id = i + d2t[i]); "
               "SGLang side records hot_token_id[i] - i. Keyed seq=-1."),
    TensorSpec("draft.accept", "verify", (), "bool", True,
               "Training side: mapped draft argmax == target argmax label at depth k."),
    TensorSpec("draft.accept_cum", "verify", (), "bool", True,
               "Training side: accepted at every depth <= k (what a chain draft gets accepted)."),
    TensorSpec("verify.draft_tokens", "verify", ("draft_tokens",), "int", False,
               "Verify tree tokens, target ids: node 0 is the previous bonus token."),
    TensorSpec("verify.retrieve_index", "verify", ("draft_tokens",), "int", False,
               "Tree retrieve index per node (SGLang build_tree_kernel_efficient)."),
    TensorSpec("verify.parents", "verify", ("draft_tokens",), "int", False,
               "Parent node of each tree node, -1 for the root."),
    TensorSpec("verify.predict", "verify", ("draft_tokens",), "int", False,
               "Target's token at each tree node (SGLang eagle_sample predict)."),
    TensorSpec("verify.accept_index", "verify", ("accept_slots",), "int", False,
               "Accepted node indices within the request's tree, padded with -1."),
    TensorSpec("verify.accepted_tokens", "verify", ("accept_slots",), "int", False,
               "Committed tokens of this verify step [d1..dn, bonus], padded with -1."),
    TensorSpec("verify.accept_length", "verify", (), "int", False,
               "Committed tokens this step = accepted drafts + 1 (SGLang accept_lens)."),
)

SPECS: dict[str, TensorSpec] = {s.name: s for s in _SPECS}
_AUX_SLOT = re.compile(r"^target\.aux\.(\d+)$")
_PROBE = re.compile(r"^target\.probe\.(\d+)$")
_LAYER_OUT = re.compile(r"^draft\.layer_out\.(\d+)$")


class UnknownTensorError(KeyError):
    """Raised for a tensor name that is not in the canonical schema."""


def aux_name(slot: int) -> str:
    """Canonical name of aux slot ``slot`` (0-based, ascending layer order): ``target.aux.{slot}``."""
    return f"target.aux.{slot}"


def aux_slot(name: str) -> int | None:
    """The slot number of a ``target.aux.{j}`` name, else None."""
    m = _AUX_SLOT.match(name)
    return int(m.group(1)) if m else None


def probe_name(hf_index: int) -> str:
    """Canonical name of the layer-identification probe of HF hidden_states[hf_index]."""
    return f"target.probe.{hf_index}"


def probe_index(name: str) -> int | None:
    """The HF index of a ``target.probe.{i}`` name, else None."""
    m = _PROBE.match(name)
    return int(m.group(1)) if m else None


def layer_out_name(layer: int) -> str:
    """Canonical name of decoder layer ``layer``'s output (a layer before the last): ``draft.layer_out.{i}``."""
    return f"draft.layer_out.{layer}"


def layer_out_index(name: str) -> int | None:
    """The decoder layer of a ``draft.layer_out.{i}`` name, else None."""
    m = _LAYER_OUT.match(name)
    return int(m.group(1)) if m else None


def spec_for(name: str) -> TensorSpec:
    """The ``TensorSpec`` for a canonical tensor name (aux slots resolve the template).

    Raises:
        UnknownTensorError: the name is not canonical.
    """
    if name in SPECS:
        return SPECS[name]
    if aux_slot(name) is not None:
        return SPECS["target.aux.{j}"]
    if probe_index(name) is not None:
        return SPECS["target.probe.{i}"]
    if layer_out_index(name) is not None:
        return SPECS["draft.layer_out.{i}"]
    raise UnknownTensorError(
        f"{name!r} is not a canonical specdiff tensor; known: {', '.join(sorted(SPECS))}")


def sort_key(name: str) -> tuple[int, int, str]:
    """Order tensor names by stage, then aux slot, then name (the first-divergence order).

    ``draft.input_ids`` sorts after ``tokens`` (same stage). Probes sort after the aux slots: they are
    evidence, not something the draft consumed. The
    outputs of a multi-layer draft's earlier layers sort before ``draft.hidden_out`` (the last
    layer's), in layer order: the first layer that differs is the one shown.
    """
    spec = spec_for(name)
    slot = aux_slot(name)
    probe = probe_index(name)
    layer = layer_out_index(name)
    sub = slot if slot is not None else (1000 + probe if probe is not None else
                                         (layer - 1000 if layer is not None else -1))
    if name == "draft.input_ids":  # what each depth was fed, after the token stream it is judged against
        sub = 0
    return (spec.stage_index, sub, name)


def ordered(names) -> list[str]:
    """``names`` sorted in dataflow order (see ``sort_key``)."""
    return sorted(names, key=sort_key)
