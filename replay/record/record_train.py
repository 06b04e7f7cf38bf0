"""Record a training-side trace: teacher-forced EAGLE-3 TTT forward over token sequences.

``record_train`` loads the target with transformers (in the serving dtype, bf16 by default, so
tolerances against a serving trace stay tight), loads the draft checkpoint in either format
(``replay.checkpoint``), runs the target with all hidden states and the reference draft forward
(``replay.draft_model``) on right-padded batches, and writes every canonical tensor
(``tracer.schema``) keyed (seq, pos, depth) with ``iter = -1``:

- ``tokens`` at (t, k) = x_{t+1+k}, the draft input token of every valid row;
- ``target.aux.{j}``, ``target.aux_cat``, ``target.argmax`` (position t predicts x_{t+1});
- ``target.probe.{i}`` for every HF index i in 0..L at the first ``probe_positions`` positions
  (layer-identification evidence for ``specdiff diff``'s explain);
- ``draft.fc_in``, ``draft.fc_out``, ``draft.hidden_in``, ``draft.positions`` (rope position
  t + k), ``draft.attn_in``, ``draft.hidden_out``;
  logits by capture level (``default``: ``draft.logits_topk.{values,ids}`` k=8 and
  ``draft.logsumexp``; ``full``: ``draft.logits``); ``draft.topk``, ``draft.topk_target``;
- ``draft.d2t``: one row per draft id (seq -1, pos i, value d2t[i]);
- ``draft.accept`` (mapped draft argmax == target argmax label at depth k, DESIGN.md pairing)
  and ``draft.accept_cum`` (accepted at every depth <= k: what a chain draft gets accepted).

Sequences come from a serving trace (``replay``: every served sequence, prompt + generated, with
its prompt_len, rid and seq id, so the two traces align row for row) or from a prompts JSONL.

Aux layers: the *training* layers, i.e. the draft's own configured ids resolved with its
convention, or what the caller states (ids + convention), concatenated in the order listed,
as a trainer does (``tracer.conventions``, concat ``listed``); contract ``aux_concat_order``.
A serving trace's ``aux_hf_indices`` are what the server captured, which is exactly what may be
wrong, so they are never used as the default.

Nothing the caller gives is rewritten: an input that cannot be used as given is refused with
one line (``RecordTrainError``), and every option left unset is filled from
``train_options.DEFAULTS`` or the serving trace and stored, with where it came from, in the
contract field ``defaults_used``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from specdiff.eagle3.acceptance import AcceptTally
from specdiff.eagle3.aux_layers import CONVENTIONS, AuxResolution, ConventionError, resolve_aux_ids
from specdiff.replay.model.checkpoint import LoadedDraft, load_draft
from specdiff.replay.model.draft_model import Eagle3Draft, TTTOutput
from specdiff.replay.model.target_capture import (
    TargetCapture,
    capture_target,
    load_target,
    target_embedding,
    target_lm_head,
    target_num_layers,
)
from specdiff.replay.record.train_options import (
    AUX_CONVENTION_DEFAULT,
    CAPTURE_LEVELS,
    DTYPE_NAMES,
    fill_defaults,
)
from specdiff.tracer.async_writer import AsyncTraceWriter
from specdiff.tracer.contract import (
    DEFAULTS_USED,
    bos_added_fact,
    known,
    rope_scaling_fact,
    tokenizer_hashes,
    validate_contract,
    weight_sha256,
)
from specdiff.tracer.errors import SpecdiffError, TraceError
from specdiff.tracer.jsonl import iter_jsonl
from specdiff.tracer.rows import RowBatch, RowLayout, target_rows, ttt_rows
from specdiff.tracer.store import TraceWriter, open_trace

__all__ = ["RecordTrainError", "TrainSequence", "RecordTrainResult", "DTYPES", "CAPTURE_LEVELS",
           "LOGITS_TOPK", "sequences_from_trace", "sequences_from_prompts", "resolve_train_aux",
           "TrainReplayer", "record_train"]

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
LOGITS_TOPK = 8


class RecordTrainError(SpecdiffError):
    """Bad input to ``record train`` (one clear line)."""


@dataclass
class TrainSequence:
    """One sequence to replay: int tokens, how many came from the prompt, request id, seq id."""

    tokens: np.ndarray
    prompt_len: int
    rid: str | None = None
    seq_id: int | None = None


@dataclass
class RecordTrainResult:
    """What ``record_train`` wrote.

    Attributes:
        path: the trace.
        sequences / positions: sequences replayed and their total length.
        aux: the aux resolution used (training layers).
        accept_rate: per depth k, the fraction of valid rows with ``draft.accept``.
        accept_cum_rate: per depth k, the fraction with ``draft.accept_cum``.
        mean_accept_length: chain accept length 1 + sum_k accept_cum, averaged over positions
            whose every depth is valid (SGLang's ``spec_accept_length`` counts the bonus token too).
        seconds: wall time of the replay (model loading excluded).
        notes: plain-words remarks (draft notes, aux notes).
        defaults_used: option -> {"value", "source"} for every option the caller left unset.
    """

    path: str
    sequences: int
    positions: int
    aux: AuxResolution
    accept_rate: list[float]
    accept_cum_rate: list[float]
    mean_accept_length: float
    seconds: float
    notes: list[str] = field(default_factory=list)
    defaults_used: dict[str, dict] = field(default_factory=dict)


# ---- sequences ------------------------------------------------------------------------------
def sequences_from_trace(path: str) -> tuple[list[TrainSequence], dict]:
    """Every sequence of a (serving) trace, with its prompt_len, rid and seq id; and its contract.

    Sequences with fewer than 2 tokens have no draft row and are left out; the returned
    contract then holds ``skipped_sequences`` (their seq ids) so the caller can say so."""
    trace = open_trace(path)
    seqs = [TrainSequence(np.asarray(s.tokens, np.int64), int(s.prompt_len), s.rid, int(s.id))
            for s in trace.sequences if len(s.tokens) >= 2]
    if not seqs:
        raise RecordTrainError(f"{path}: the trace holds no token sequences to replay")
    contract = dict(trace.contract)
    skipped = [int(s.id) for s in trace.sequences if len(s.tokens) < 2]
    if skipped:
        contract["skipped_sequences"] = skipped
    return seqs, contract


def _load_tokenizer(target_dir: Path):
    if not any((target_dir / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                      "tokenizer.model")):
        raise RecordTrainError(f"{target_dir}: no tokenizer files; give token ids in the prompts file "
                               "(\"input_ids\": [...])")
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(str(target_dir), local_files_only=True)
    except Exception as e:
        raise RecordTrainError(f"cannot load the tokenizer of {target_dir}: {type(e).__name__}: {e}") from None


def sequences_from_prompts(path: str | Path, target_dir: str | Path, *,
                           defaults_used: dict | None = None) -> list[TrainSequence]:
    """Sequences from a JSONL file, one object per line, any of:

    - ``{"input_ids": [...]}`` or ``{"tokens": [...]}`` (token ids; optional ``"prompt_len"``);
    - ``{"text": "..."}`` (tokenized with the target's tokenizer, special tokens added);
    - ``{"prompt": "...", "completion": "..."}`` (completion optional; prompt_len = prompt tokens);
    - ``{"messages": [...]}`` (the tokenizer's chat template).

    An optional ``"rid"`` names the sample. Raises RecordTrainError naming the line.

    How text becomes tokens is a choice made here, not by the file: when ``defaults_used`` is a
    dict, the choices used are added to it (``text_special_tokens``, ``chat_generation_prompt``).
    """
    path = Path(path)
    if not path.is_file():
        raise RecordTrainError(f"{path}: no such prompts file")
    tok = None
    out: list[TrainSequence] = []
    for n, obj in iter_jsonl(path, error=RecordTrainError):
        if not isinstance(obj, dict):
            raise RecordTrainError(f"{path}:{n}: expected a JSON object per line")
        rid = str(obj.get("rid", obj.get("id", f"prompt-{len(out)}")))
        ids_key = "input_ids" if "input_ids" in obj else "tokens" if "tokens" in obj else None
        if ids_key:
            ids = obj[ids_key]
            if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                raise RecordTrainError(f"{path}:{n}: {ids_key} must be a list of ints")
            plen = obj.get("prompt_len", len(ids))
            if not isinstance(plen, int) or not 0 <= plen <= len(ids):
                raise RecordTrainError(f"{path}:{n}: prompt_len {plen!r} is not an int in 0..{len(ids)} "
                                       "(the number of tokens that came from the prompt)")
        else:
            if tok is None:
                tok = _load_tokenizer(Path(target_dir))
            if "messages" in obj:
                try:
                    ids = list(tok.apply_chat_template(obj["messages"], tokenize=True))
                    _note_default(defaults_used, "chat_generation_prompt", False,
                                  "record train default: messages go through the tokenizer's chat template "
                                  "without a generation prompt (add_generation_prompt=False)")
                except Exception as e:
                    raise RecordTrainError(f"{path}:{n}: chat template failed: {e}") from None
                if ids and isinstance(ids[0], list):
                    ids = ids[0]
                plen = len(ids)
            elif "prompt" in obj or "text" in obj:
                prompt = obj.get("prompt", obj.get("text"))
                ids = tok(prompt, add_special_tokens=True)["input_ids"]
                _note_default(defaults_used, "text_special_tokens", True,
                              "record train default: text prompts are tokenized with the tokenizer's special "
                              "tokens (BOS), a completion without")
                plen = len(ids)
                if obj.get("completion"):
                    ids = ids + tok(obj["completion"], add_special_tokens=False)["input_ids"]
            else:
                raise RecordTrainError(f"{path}:{n}: needs one of input_ids, tokens, text, prompt, messages")
        if len(ids) < 2:
            raise RecordTrainError(f"{path}:{n}: a sequence needs at least 2 tokens, got {len(ids)}")
        out.append(TrainSequence(np.asarray(ids, np.int64), plen, rid, None))
    if not out:
        raise RecordTrainError(f"{path}: no prompts")
    return out


def _note_default(defaults_used: dict | None, name: str, value, source: str) -> None:
    if defaults_used is not None:
        defaults_used.setdefault(name, {"value": value, "source": source})


@torch.no_grad()
def _extend_greedy(target, seqs: list[TrainSequence], max_new_tokens: int) -> list[TrainSequence]:
    """Append the target's greedy continuation (``max_new_tokens``) to each sequence."""
    from specdiff.replay.model.target_capture import greedy_generate

    dev = next(target.parameters()).device
    out = []
    for s in seqs:
        ids = torch.as_tensor(s.tokens, dtype=torch.int64, device=dev)[None]
        gen = greedy_generate(target, ids, max_new_tokens)[0].cpu().numpy()
        out.append(TrainSequence(np.concatenate([s.tokens, gen]), s.prompt_len, s.rid, s.seq_id))
    return out


# ---- aux layers -----------------------------------------------------------------------------
def resolve_train_aux(loaded: LoadedDraft, num_layers: int, aux_layers=None,
                      aux_convention: str | None = None) -> AuxResolution:
    """The aux layers training feeds, in the order listed (slot j = the j-th id): ``aux_layers``
    read in ``aux_convention`` (default ``hf``), else the draft config's own ids in its
    convention and order (tool default when it has none).

    Raises RecordTrainError when the ids are invalid, cannot be used in the order given (a
    layer twice, an id the convention never captures) or their count differs from the draft's K.
    """
    c = loaded.config
    try:
        if aux_layers is not None:
            res = resolve_aux_ids(list(aux_layers), convention=aux_convention or AUX_CONVENTION_DEFAULT,
                                  num_layers=num_layers, concat="listed")
        else:
            res = resolve_aux_ids(c.eagle_aux_hidden_state_layer_ids, convention=c.aux_convention,
                                  num_layers=num_layers, concat="listed")
    except ConventionError as e:
        src = (f"--aux-layers {list(aux_layers)}" if aux_layers is not None
               else f"the draft config ids {c.eagle_aux_hidden_state_layer_ids} ({c.aux_convention})")
        raise RecordTrainError(f"aux layers: {e}; give the layers training fed, in its concat order, "
                               f"with --aux-layers (from {src})") from None
    if len(res.hf_indices) != c.num_aux:
        src = (f"--aux-layers {list(aux_layers)} ({aux_convention or AUX_CONVENTION_DEFAULT})"
               if aux_layers is not None
               else f"the draft config ids {c.eagle_aux_hidden_state_layer_ids} ({c.aux_convention})")
        raise RecordTrainError(
            f"{src} resolve to {len(res.hf_indices)} aux slots HF {list(res.hf_indices)} but the draft's "
            f"fc expects {c.num_aux} slots x {c.target_hidden_size} = {c.aux_width} features")
    if aux_layers is None and list(res.hf_indices) != sorted(res.hf_indices):
        res = dataclasses.replace(res, notes=res.notes + (
            f"the draft config lists its aux ids {c.eagle_aux_hidden_state_layer_ids} out of ascending order: "
            f"the training side concatenates them as listed, HF {list(res.hf_indices)} (as SpecForge does); "
            f"SGLang concatenates HF {sorted(res.hf_indices)}. If training concatenated in ascending order, "
            "pass --aux-layers in that order",))
    return res


def _sha256_file(path: Path) -> str | None:
    if not path.is_file():
        return None
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("specdiff")
    except Exception:
        return "unknown"


# ---- the replayer ---------------------------------------------------------------------------
class TrainReplayer:
    """Target + draft ready to replay batches; ``forward`` computes, ``write`` records.

    Args:
        target: HF causal LM (eval).
        draft: Eagle3Draft (eval, its dtype is the draft compute dtype).
        aux: the aux resolution (training layers).
        steps: TTT depths.
        topk: speculative topk of ``draft.topk``.
        capture: ``default`` or ``full`` (logits level).
        probe_positions: probe every HF layer at positions t < this (0 = no probes).
    """

    def __init__(self, target, draft: Eagle3Draft, aux: AuxResolution, *, steps: int = 3, topk: int = 1,
                 capture: str = "default", probe_positions: int = 64, pad_id: int = 0):
        if capture not in CAPTURE_LEVELS:
            raise RecordTrainError(f"capture level {capture!r}: use one of {', '.join(CAPTURE_LEVELS)}")
        if steps < 1:
            raise RecordTrainError(f"steps must be >= 1, got {steps}")
        self.target, self.draft, self.aux = target, draft, aux
        self.steps, self.topk, self.capture = steps, topk, capture
        self.probe_positions = probe_positions
        self.pad_id = pad_id
        self.num_layers = target_num_layers(target)
        self.accept = AcceptTally(steps)  # draft.accept alone
        self.accept_cum = AcceptTally(steps)  # draft.accept_cum, every defined row
        self.chain = AcceptTally(steps)  # draft.accept_cum at positions whose every depth is defined

    @staticmethod
    def pad(seqs: list[TrainSequence]) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-padded input_ids [B,T] int64 and lengths [B]."""
        lengths = torch.tensor([len(s.tokens) for s in seqs], dtype=torch.int64)
        ids = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.int64)
        for r, s in enumerate(seqs):
            ids[r, : len(s.tokens)] = torch.as_tensor(s.tokens, dtype=torch.int64)
        return ids, lengths

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor) -> tuple[TargetCapture, TTTOutput]:
        """The bare forward: target with hidden states, then the draft's TTT forward."""
        cap = capture_target(self.target, input_ids, self.aux.hf_indices, lengths=lengths,
                             keep_all=self.probe_positions > 0)
        dev = next(self.draft.parameters()).device
        out = self.draft.ttt_forward(cap.aux_cat.to(dev), input_ids.to(dev), self.steps, lengths=lengths,
                                     pad_id=self.pad_id)
        return cap, out

    @torch.no_grad()
    def rows(self, seq_ids: list[int], cap: TargetCapture, out: TTTOutput) -> RowBatch:
        """Every canonical row of one batch (row b -> ``seq_ids[b]``), built by
        ``tracer.rows`` (the row builder the training hooks share); also accumulates the
        acceptance statistics (``accept_rates``)."""
        layout = RowLayout.padded(seq_ids, cap.lengths, cap.input_ids.shape[1])
        batch = RowBatch()
        target_rows(batch, layout, aux=cap.aux, aux_cat=cap.aux_cat, argmax=cap.argmax,
                    hidden_states=cap.hidden_states, probe_positions=self.probe_positions)
        last = layout.defined(self.steps - 1)

        def tally(d, idx, outs, chain):
            self.accept.add(d, outs["draft.accept"])
            self.accept_cum.add(d, outs["draft.accept_cum"])
            self.chain.add(d, chain.cum[torch.as_tensor(last)])

        ttt_rows(batch, layout, out, level=self.capture, logits_topk=LOGITS_TOPK, topk=self.topk,
                 hot_token_id=self.draft.hot_token_id(), argmax=cap.argmax, on_depth=tally)
        return batch

    def write(self, writer, seq_ids: list[int], cap: TargetCapture, out: TTTOutput) -> None:
        """Append every canonical row of one batch to ``writer`` (a TraceWriter)."""
        self.rows(seq_ids, cap, out).flush(writer)

    def write_d2t(self, writer: TraceWriter) -> None:
        d2t = self.draft.d2t.detach().cpu().to(torch.int64)
        writer.append("draft.d2t", d2t.numpy(), seq=-1, pos=np.arange(d2t.shape[0], dtype=np.int32), depth=0)

    def accept_rates(self) -> tuple[list[float], list[float], float]:
        """(``draft.accept`` rate, ``draft.accept_cum`` rate) per depth over every defined row,
        and the mean accept length (``specdiff.eagle3.acceptance``: 1 + the sum of the
        cumulative rates) over the positions whose every depth is defined; NaN when none is."""
        mean = self.chain.mean_accept_length() if self.chain.count[-1] else float("nan")
        return list(self.accept.per_depth()), list(self.accept_cum.per_depth()), mean


def _batches(seqs: list[TrainSequence], batch_size: int, max_tokens: int) -> list[list[int]]:
    """Indices grouped by similar length (longest first), at most ``batch_size`` sequences and
    about ``max_tokens`` padded tokens per batch."""
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i].tokens))
    out, cur = [], []
    for i in order:
        longest = len(seqs[cur[0]].tokens) if cur else len(seqs[i].tokens)
        if cur and (len(cur) >= batch_size or longest * (len(cur) + 1) > max_tokens):
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


def _quiet_transformers() -> None:
    """No weight-loading progress bars or info logs: the CLI's output stays one line per fact."""
    try:
        from transformers.utils import logging as tlog
        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    except Exception:
        pass


def draft_computation_facts(draft, config, *, vocab: int, seqs, bos_token_id, tokenizer_dir) -> dict:
    """The contract fields that decide the draft's computation, from the training side's live
    draft module and sequences (the same field names and hashing as the SGLang recorder,
    tracer/contract.py): algorithm, embedding / lm_head sha256, rope as the reference attention
    applies it (rotate_half = neox), BOS and chat template. The aux layers and their concat
    order come from ``AuxResolution.as_facts``.
    """
    scaling = config.rope_scaling or {}
    kind = scaling.get("rope_type", scaling.get("type")) if scaling else None
    params = {k: scaling.get(k) for k in ("factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings") if scaling.get(k) is not None}
    return {
        "spec_algorithm": "EAGLE3",  # the reference forward is EAGLE-3's (fc over the aux concat)
        "embed_sha256": weight_sha256(draft.embed_tokens.weight, rows=vocab),
        "lm_head_sha256": weight_sha256(draft.lm_head.weight, rows=config.draft_vocab_size),
        "rope_theta": float(config.rope_theta),
        "rope_scaling": rope_scaling_fact(kind, **params),
        "rope_style": "neox",  # draft_model.py applies rope with rotate_half
        "bos_added": bos_added_fact([int(s.tokens[0]) for s in seqs if len(s.tokens)], bos_token_id),
        "chat_template_sha256": tokenizer_hashes(tokenizer_dir)[1],
    }


def _parse_dtype(name: str, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise RecordTrainError(f"{what} {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


def _check_counts(*, steps, topk, probe_positions, max_new_tokens, batch_size, replay) -> None:
    """Refuse option values that cannot be used as given (one line each, naming the option)."""
    for opt, value, low in (("--steps", steps, 1), ("--topk", topk, 1), ("--probe-positions", probe_positions, 0),
                            ("--max-new-tokens", max_new_tokens, 0), ("--batch-size", batch_size, 1)):
        if value is not None and int(value) < low:
            raise RecordTrainError(f"{opt} {value}: must be >= {low}")
    if replay is not None and max_new_tokens:
        raise RecordTrainError("--max-new-tokens extends --prompts sequences; with --replay the served "
                               "sequences are replayed exactly as served (leave it out)")


def _aux_defaults(aux_layers, aux_convention, loaded: LoadedDraft, aux: AuxResolution) -> dict[str, dict]:
    """``defaults_used`` entries for the aux layers / convention the caller left unset."""
    used: dict[str, dict] = {}
    if aux_layers is None:
        c = loaded.config
        if c.eagle_aux_hidden_state_layer_ids is None:
            src = f"no ids in the draft config: the {c.aux_convention} default HF [2, L//2, L-3]"
        else:
            key = ("eagle_aux_hidden_state_layer_ids" if loaded.format == "speculators"
                   else "eagle_config.eagle_aux_hidden_state_layer_ids")
            src = f"the draft config's {key} {c.eagle_aux_hidden_state_layer_ids}, in the order listed"
        used["aux_layers"] = {"value": list(aux.hf_indices), "source": src + " (HF indices, concat order)"}
        used["aux_convention"] = {"value": aux.convention, "source": f"the draft's {loaded.format} format"}
    elif aux_convention is None:
        used["aux_convention"] = {"value": AUX_CONVENTION_DEFAULT, "source": "record train default for --aux-layers"}
    return used


def record_train(target_dir: str | Path, draft_dir: str | Path, out: str, *,
                 replay: str | None = None, prompts: str | Path | None = None,
                 aux_layers=None, aux_convention: str | None = None, steps: int | None = None,
                 topk: int | None = None, dtype: str | None = None, target_dtype: str | None = None,
                 capture: str | None = None, probe_positions: int | None = None,
                 max_new_tokens: int | None = None, batch_size: int | None = None,
                 max_batch_tokens: int = 8192, overwrite: bool = False, device: str | None = None,
                 progress: Callable[[int], None] | None = None,
                 on_start: Callable[[int, RecordTrainResult], None] | None = None) -> RecordTrainResult:
    """Replay sequences through target + draft and write a training-side trace at ``out``.

    Every option left None takes its value from ``train_options.DEFAULTS`` (or, for steps / topk,
    the serving trace); each such value is in the result's and the contract's ``defaults_used``.

    Args:
        target_dir / draft_dir: local HF target and EAGLE-3 draft checkpoint (either format).
        replay: a serving trace whose sequences (prompt + generated) are replayed, keeping their
            seq ids, prompt_len and rid. Its ``spec_steps`` / ``spec_topk`` are the defaults of
            ``steps`` / ``topk``; its ``aux_hf_indices`` are NOT used (they are what serving did).
        prompts: a JSONL file (``sequences_from_prompts``); ``max_new_tokens`` > 0 extends each
            with the target's greedy continuation (refused with ``replay``).
        aux_layers / aux_convention: the training aux layers in training's concat order (default:
            the draft config's ids, in the order listed); ``aux_convention`` needs ``aux_layers``.
        steps: TTT depths (default: the serving trace's spec_steps, else 3).
        topk: ``draft.topk`` width (default: the serving trace's spec_topk, else 1).
        dtype: draft compute dtype; target_dtype: target dtype (the serving dtype, bf16).
        capture: ``default`` (top-8 logits + logsumexp) or ``full`` (all draft logits).
        probe_positions: every HF hidden state is recorded at the first this-many positions.
        progress: called with the number of sequences finished after each batch.
        on_start: called once with (total sequences, a result stub holding aux, notes and
            defaults_used).

    Raises:
        RecordTrainError / CheckpointError / TargetError / TraceError: one line each.
    """
    if (replay is None) == (prompts is None):
        raise RecordTrainError("give exactly one of --replay SERVE_TRACE or --prompts FILE.jsonl")
    if aux_convention is not None and aux_layers is None:
        raise RecordTrainError(f"--aux-convention {aux_convention} says how to read --aux-layers, which is "
                               "missing; give both (e.g. --aux-layers 0,3,6 --aux-convention hf) or neither "
                               "(the draft config's ids in its own convention)")
    _check_counts(steps=steps, topk=topk, probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                  batch_size=batch_size, replay=replay)
    for opt, name in (("--dtype", dtype), ("--target-dtype", target_dtype)):
        if name is not None:
            _parse_dtype(name, opt)
    if capture is not None and capture not in CAPTURE_LEVELS:
        raise RecordTrainError(f"--capture {capture!r}: use one of {', '.join(CAPTURE_LEVELS)}")
    if aux_convention is not None and aux_convention not in CONVENTIONS:
        raise RecordTrainError(f"--aux-convention {aux_convention!r}: use one of {', '.join(CONVENTIONS)}")
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    served: dict = {}
    token_defaults: dict[str, dict] = {}
    if replay is not None:
        seqs, served = sequences_from_trace(replay)
    else:
        seqs = sequences_from_prompts(prompts, target_dir, defaults_used=token_defaults)
    if not overwrite and Path(str(out)).exists():
        raise RecordTrainError(f"{out}: already exists; choose another path or pass --overwrite")
    opts, defaults_used = fill_defaults(
        {"steps": steps, "topk": topk, "dtype": dtype, "target_dtype": target_dtype, "capture": capture,
         "probe_positions": probe_positions, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
         "device": device}, served)
    steps, topk, dtype, target_dtype = int(opts["steps"]), int(opts["topk"]), opts["dtype"], opts["target_dtype"]
    capture, probe_positions, device = opts["capture"], int(opts["probe_positions"]), opts["device"]
    max_new_tokens, batch_size = int(opts["max_new_tokens"]), int(opts["batch_size"])
    ddtype = _parse_dtype(dtype, "--dtype")
    tdtype = _parse_dtype(target_dtype, "--target-dtype")

    _quiet_transformers()
    target = load_target(target_dir, dtype=tdtype).to(device)
    L = target_num_layers(target)
    loaded = load_draft(draft_dir, dtype=ddtype, target_embedding=target_embedding(target).float(),
                        target_lm_head=target_lm_head(target).float())
    draft = loaded.model.to(device)
    aux = resolve_train_aux(loaded, L, aux_layers, aux_convention)
    defaults_used = {**_aux_defaults(aux_layers, aux_convention, loaded, aux), **defaults_used, **token_defaults}
    if max_new_tokens > 0:
        seqs = _extend_greedy(target, seqs, max_new_tokens)
    if topk > loaded.config.draft_vocab_size:
        raise RecordTrainError(f"topk {topk} exceeds the draft vocab {loaded.config.draft_vocab_size}")

    tcfg = target.config
    facts = loaded.contract_facts(num_layers=L)
    notes = list(facts.pop("draft_notes", [])) + list(aux.notes)
    if served.get("skipped_sequences"):
        notes.append(f"serving sequences {served['skipped_sequences']} have fewer than 2 tokens (no draft row): "
                     "not replayed")
    facts.update(aux.as_facts())
    facts.update({
        "engine": "specdiff-reference", "engine_version": _version(), "side": "train",
        "num_layers": L, "hidden_size": int(tcfg.hidden_size), "vocab_size": int(tcfg.vocab_size),
        "spec_steps": steps, "spec_topk": topk, "dtype": dtype, "target_dtype": target_dtype,
        "capture_level": capture, "logits_topk": LOGITS_TOPK if capture == "default" else 0,
        "model_name": str(target_dir), "draft_name": str(draft_dir),
        "tokenizer_sha256": _sha256_file(target_dir / "tokenizer.json"),
        "probe_positions": int(probe_positions), "notes": notes, DEFAULTS_USED: defaults_used,
    })
    facts.update(draft_computation_facts(draft, loaded.config, vocab=int(tcfg.vocab_size),
                                         seqs=seqs, bos_token_id=getattr(tcfg, "bos_token_id", None),
                                         tokenizer_dir=target_dir))
    facts["findings"] = _preflight_facts(target_dir, draft_dir, aux.hf_indices)
    if replay is not None:
        facts["replay_of"] = str(replay)
        if known(served, "aux_hf_indices") is not None:
            facts["served_aux_hf_indices"] = list(served["aux_hf_indices"])
    try:
        validate_contract(facts, where=str(out))
    except TraceError as e:
        raise RecordTrainError(str(e)) from None

    writer = TraceWriter(str(out), side="train", contract=facts, overwrite=overwrite)
    pad_id = getattr(tcfg, "pad_token_id", None)
    rep = TrainReplayer(target, draft, aux, steps=steps, topk=topk, capture=capture,
                        probe_positions=probe_positions, pad_id=int(pad_id) if pad_id is not None else 0)
    result = RecordTrainResult(str(out), len(seqs), int(sum(len(s.tokens) for s in seqs)), aux,
                               [], [], float("nan"), 0.0, notes, defaults_used)
    if on_start:
        on_start(len(seqs), result)
    t0 = time.perf_counter()
    try:
        seq_ids = []
        for i, s in enumerate(seqs):
            sid = writer.add_sequence(s.tokens, prompt_len=s.prompt_len, rid=s.rid,
                                      seq_id=s.seq_id if s.seq_id is not None else i)
            seq_ids.append(sid)
        rep.write_d2t(writer)
    except BaseException:
        writer.close()
        raise
    # Appends run on one thread so compression and I/O overlap the next batch's forward;
    # lossless: a full queue waits, and a write error is raised here by submit / close.
    aw = AsyncTraceWriter(writer, lambda w, item: item[1].flush(w), max_items=2, lossless=True,
                          on_written=(lambda item: progress(item[0])) if progress else None)
    facts: dict = {}
    try:
        for idx in _batches(seqs, batch_size, max_batch_tokens):
            ids, lengths = TrainReplayer.pad([seqs[i] for i in idx])
            cap, tout = rep.forward(ids, lengths)
            aw.submit((len(idx), rep.rows([seq_ids[i] for i in idx], cap, tout)))
        acc, acc_cum, mean = rep.accept_rates()
        facts = {"accept_rate": acc, "accept_cum_rate": acc_cum,
                 "mean_accept_length": None if mean != mean else mean}
    finally:
        aw.close(timeout_s=None, contract=facts)
    result.accept_rate, result.accept_cum_rate, result.mean_accept_length = acc, acc_cum, mean
    result.seconds = time.perf_counter() - t0
    return result


def _preflight_facts(target_dir, draft_dir, training_hf) -> list[dict]:
    """``specdiff check`` on the pair as recorded (error/warn only), for the contract ``findings``."""
    from specdiff.replay.preflight.check import findings_as_facts, run_preflight

    try:
        report = run_preflight(target_dir, draft_dir, training_layers=list(training_hf), training_convention="hf")
    except SpecdiffError:
        return []
    return [f for f in findings_as_facts(report.findings) if f["severity"] in ("error", "warn")]
