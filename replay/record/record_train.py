"""Record a training-side trace: teacher-forced EAGLE-3 TTT forward over token sequences.

Owns the ``record train`` run: options and their defaults, loading the models, the contract
facts, and driving the batches through the background writer. The pieces live beside it:
``sequences`` (what is replayed, batching), ``train_aux`` (the training aux layers),
``replayer`` (the forward and its rows, built by ``tracer.rows``), ``train_facts`` (the contract
facts that come from outside the rows), ``errors``; model loading's dtypes and quiet output are
``replay.model.loading``.

``record_train`` loads the target with transformers (in the serving dtype, bf16 by default, so
tolerances against a serving trace stay tight), loads the draft checkpoint in either format
(``replay.model.checkpoint``), runs the target with all hidden states and the reference draft forward
(``replay.model.draft_model``) on right-padded batches, and writes every canonical tensor
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
wrong, so they are never used as the default. An id that names the last decoder layer's output
before the final norm in its convention (GPT-OSS's SGLang id L) is read from the final norm's
input (``train_aux``), contract ``aux_prenorm_indices``.

Target identity: ``target_architecture``, ``target_config_sha256``, ``target_num_experts`` /
``target_experts_per_token`` and ``target_weights_fingerprint`` of the target as loaded
(``tracer.contract.target_identity_facts``, the same computation as the SGLang recorder's), so
``specdiff diff`` refuses a pair recorded on two different targets.

Nothing the caller gives is rewritten: an input that cannot be used as given is refused with
one line (``RecordTrainError``), and every option left unset is filled from
``train_options.DEFAULTS`` or the serving trace and stored, with where it came from, in the
contract field ``defaults_used``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specdiff.eagle3.aux_layers import CONVENTIONS, AuxResolution, target_architecture
from specdiff.replay.model.checkpoint import LoadedDraft, load_draft
from specdiff.replay.model.loading import DTYPES, quiet_transformers
from specdiff.replay.model.target_capture import (
    load_target,
    target_embedding,
    target_lm_head,
    target_num_layers,
)
from specdiff.replay.record.replayer import LOGITS_TOPK, TrainReplayer
from specdiff.replay.record.sequences import (
    TrainSequence,
    batches_by_length,
    extend_greedy,
    sequences_from_prompts,
    sequences_from_trace,
)
from specdiff.replay.record.specforge_contract import SpecForgeRecord, read_specforge
from specdiff.replay.record.train_aux import resolve_train_aux
from specdiff.replay.record.train_facts import (
    draft_computation_facts,
    live_facts,
    preflight_facts,
    prenorm_notes,
)
from specdiff.replay.record.train_options import (
    AUX_CONVENTION_DEFAULT,
    CAPTURE_LEVELS,
    check_aux_convention,
    check_counts,
    check_device,
    fill_defaults,
)
from specdiff.replay.record.train_writer import RecordTrainResult, write_train_trace
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.replay.trainers.registry import DEFAULT_TRAINER, load_trainer_draft, require_trainer
from specdiff.tracer.contract import known, target_identity_facts, validate_contract
from specdiff.tracer.contract_fields import DEFAULTS_USED
from specdiff.tracer.errors import TraceError
from specdiff.tracer.paths import recorded_path
from specdiff.tracer.store import TraceWriter

__all__ = ["RecordTrainError", "TrainSequence", "RecordTrainResult", "CAPTURE_LEVELS",
           "LOGITS_TOPK", "sequences_from_trace", "sequences_from_prompts", "resolve_train_aux",
           "TrainReplayer", "TrainSide", "check_train_options", "load_train_side", "record_train"]

def _sha256_file(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("specdiff")
    except Exception:
        return "unknown"


def _parse_dtype(name: str, what: str) -> torch.dtype:
    if name not in DTYPES:
        raise RecordTrainError(f"{what} {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[name]


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


def check_train_options(*, aux_layers=None, aux_convention: str | None = None, steps=None, topk=None,
                        dtype: str | None = None, target_dtype: str | None = None, capture: str | None = None,
                        probe_positions=None, max_new_tokens=None, batch_size=None, replay=None,
                        device: str | None = None, trainer: str | None = None) -> None:
    """Refuse option values ``record train`` (and ``specdiff watch``, which replays the same way)
    cannot use as given, before any model is loaded.

    ``trainer``: ``--trainer``; a trainer whose package is not installed is refused here, the line
    naming its pip command (``replay.trainers.registry``).

    Raises:
        RecordTrainError: one line naming the option.
    """
    check_aux_convention(aux_layers, aux_convention)
    check_counts(steps=steps, topk=topk, probe_positions=probe_positions, max_new_tokens=max_new_tokens,
                  batch_size=batch_size, replay=replay)
    for opt, name in (("--dtype", dtype), ("--target-dtype", target_dtype)):
        if name is not None:
            _parse_dtype(name, opt)
    if capture is not None and capture not in CAPTURE_LEVELS:
        raise RecordTrainError(f"--capture {capture!r}: use one of {', '.join(CAPTURE_LEVELS)}")
    if aux_convention is not None and aux_convention not in CONVENTIONS:
        raise RecordTrainError(f"--aux-convention {aux_convention!r}: use one of {', '.join(CONVENTIONS)}")
    check_device(device)
    if trainer is not None:
        require_trainer(trainer)


@dataclass
class TrainSide:
    """The training side, loaded once: target, draft, training aux layers and the filled-in options,
    ready to replay token sequences into training traces. ``record train`` loads one per run and
    replays every sequence; ``specdiff watch`` keeps one and replays each served request as it ends.

    Attributes:
        target_dir / draft_dir: the model directories as given.
        target: the HF target (eval, ``target_dtype``, on ``device``).
        loaded: the draft checkpoint (``replay.model.checkpoint.LoadedDraft``); ``loaded.model``
            is on ``device``.
        aux: the training aux resolution (``train_aux.resolve_train_aux``).
        replayer: the ``TrainReplayer`` (its acceptance tallies grow with every batch replayed).
        options: steps, topk, dtype, target_dtype, capture, probe_positions, max_new_tokens,
            batch_size, device: as given, else filled in (``train_options.fill_defaults``).
        defaults_used: ``defaults_used`` contract entries for every option left unset.
        served: the serving trace's contract ({} without one).
        trainer: the ``replay.trainers`` draft that computes the forward (``replayer.draft``) when
            ``--trainer`` names one other than specdiff, else None (the reference forward).
        specforge: what SpecForge recorded of the run (``specforge_contract.read_specforge``), or None.
        amend_facts: called with the computed contract facts last, before they are validated (the
            features side, which knows its target only from stored files: replay/record/record_features.py).
    """

    target_dir: Path
    draft_dir: Path
    target: torch.nn.Module
    loaded: LoadedDraft
    aux: AuxResolution
    replayer: TrainReplayer
    options: dict
    defaults_used: dict[str, dict]
    served: dict
    trainer: object | None = None
    specforge: SpecForgeRecord | None = None
    amend_facts: Callable[[dict], None] | None = None

    def contract(self, seqs: list[TrainSequence], *, out: str, replay: str | None = None) -> tuple[dict, list[str]]:
        """The contract facts of a training trace of ``seqs`` written to ``out`` (validated), and
        its notes (the same list as ``facts["notes"]``).

        Raises:
            RecordTrainError: the facts do not validate (tracer.contract.validate_contract).
        """
        o, tcfg, L = self.options, self.target.config, self.replayer.num_layers
        loaded, aux, served = self.loaded, self.aux, self.served
        # the draft's facts without its own engine-view aux resolution: the training layers (``aux``,
        # read by the target's rule, pre-norm slot included) are the aux facts of this trace
        facts = loaded.contract_facts()
        notes = list(facts.pop("draft_notes", [])) + list(aux.notes)
        if served.get("crash_replay"):
            notes.append(served["crash_replay"])
        if served.get("skipped_sequences"):
            notes.append(f"serving sequences {served['skipped_sequences']} have fewer than 2 tokens (no draft "
                         "row): not replayed")
        facts.update(aux.as_facts())
        if self.trainer is not None:
            notes.extend(self.trainer.notes)
        facts.update({
            "engine": "specdiff-reference", "engine_version": _version(), "side": "train",
            "num_layers": L, "hidden_size": int(tcfg.hidden_size), "vocab_size": int(tcfg.vocab_size),
            "spec_steps": int(o["steps"]), "spec_topk": int(o["topk"]), "dtype": o["dtype"],
            "target_dtype": o["target_dtype"], "capture_level": o["capture"],
            "logits_topk": LOGITS_TOPK if o["capture"] == "default" else 0,
            # absolute (tracer.paths): the trace names the same directories from any working directory
            "model_name": recorded_path(self.target_dir), "draft_name": recorded_path(self.draft_dir),
            "tokenizer_sha256": _sha256_file(self.target_dir / "tokenizer.json"),
            "probe_positions": int(o["probe_positions"]), "notes": notes, DEFAULTS_USED: self.defaults_used,
        })
        # the same identity facts the SGLang recorder reads from its live target (tracer/contract.py), so a
        # pair recorded on two different targets is refused by `specdiff diff` before any comparison
        facts.update(target_identity_facts(tcfg, target_embedding(self.target)))
        facts.update(live_facts(self.target, loaded, o, self.target_dir))
        if self.trainer is not None:  # who computed the forward: engine / engine_version name the trainer
            facts.update(self.trainer.facts())
        facts.update(draft_computation_facts(self.loaded.model, loaded.config, vocab=int(tcfg.vocab_size),
                                             seqs=seqs, bos_token_id=getattr(tcfg, "bos_token_id", None),
                                             tokenizer_dir=self.target_dir))
        # HF indices cannot say "pre-norm": with such a slot the check runs without training layers (no false
        # mismatch against HF L); the slot itself is in the contract (aux_prenorm_indices)
        facts["findings"] = preflight_facts(self.target_dir, self.draft_dir, None if aux.prenorm else aux.hf_indices)
        if self.specforge is not None:  # checked against the facts above: what this recording uses
            sf, sf_notes = self.specforge.facts(facts, target_dir=self.target_dir, num_layers=L)
            facts.update(sf)
            notes.extend(sf_notes)
        if replay is not None:
            facts["replay_of"] = recorded_path(replay)
            if known(served, "aux_hf_indices") is not None:
                facts["served_aux_hf_indices"] = list(served["aux_hf_indices"])
            notes.extend(prenorm_notes(served, aux, L))
        if self.amend_facts is not None:
            self.amend_facts(facts)
        try:
            validate_contract(facts, where=str(out))
        except TraceError as e:
            raise RecordTrainError(str(e)) from None
        return facts, notes

    def open_trace(self, out: str, seqs: list[TrainSequence], facts: dict, *,
                   overwrite: bool = False) -> tuple[TraceWriter, list[int]]:
        """A new training trace at ``out`` holding ``seqs`` (their seq ids kept when set) and the
        draft's ``draft.d2t``; returns the writer and the trace seq id of each sequence.

        Raises:
            TraceError: ``out`` exists and not ``overwrite``.
        """
        writer = TraceWriter(str(out), side="train", contract=facts, overwrite=overwrite)
        try:
            seq_ids = self.add_sequences(writer, seqs)
            self.replayer.write_d2t(writer)
        except BaseException:
            writer.close()
            raise
        return writer, seq_ids

    @staticmethod
    def add_sequences(writer: TraceWriter, seqs: list[TrainSequence]) -> list[int]:
        """Register ``seqs`` in ``writer`` (a served sequence keeps its seq id, so the traces align
        row for row; one without takes its index in ``seqs``); returns their trace seq ids."""
        return [writer.add_sequence(s.tokens, prompt_len=s.prompt_len, rid=s.rid,
                                    seq_id=s.seq_id if s.seq_id is not None else i)
                for i, s in enumerate(seqs)]

    def accept_facts(self) -> dict:
        """The contract facts of the acceptance replayed so far: ``accept_rate`` / ``accept_cum_rate``
        (per depth, fractions) and ``mean_accept_length`` (tokens per verify step; None before any
        row was replayed: the replayer's NaN)."""
        acc, acc_cum, mean = self.replayer.accept_rates()
        return {"accept_rate": acc, "accept_cum_rate": acc_cum, "mean_accept_length": None if mean != mean else mean}

    def batches(self, seqs: list[TrainSequence], seq_ids: list[int], *, max_batch_tokens: int = 8192):
        """Yield (number of sequences, ``RowBatch``) per padded batch of ``seqs``: the target and
        draft forward of the batch and every canonical row (``TrainReplayer.rows``; the acceptance
        tallies grow). Sequences of similar length share a batch (``batches_by_length``)."""
        rep = self.replayer
        for idx in batches_by_length(seqs, int(self.options["batch_size"]), max_batch_tokens):
            ids, lengths = TrainReplayer.pad([seqs[i] for i in idx])
            cap, tout = rep.forward(ids, lengths, [seqs[i] for i in idx])
            yield len(idx), rep.rows([seq_ids[i] for i in idx], cap, tout)


def load_train_side(target_dir: str | Path, draft_dir: str | Path, *, served: dict | None = None,
                    aux_layers=None, aux_convention: str | None = None, steps: int | None = None,
                    topk: int | None = None, dtype: str | None = None, target_dtype: str | None = None,
                    capture: str | None = None, probe_positions: int | None = None,
                    max_new_tokens: int | None = None, batch_size: int | None = None,
                    device: str | None = None, extra_defaults: dict | None = None,
                    trainer: str | None = None, draft_window: int | None = None, target=None,
                    aux=None, device_map: str | None = None) -> TrainSide:
    """Load the target and the draft checkpoint and resolve the training aux layers and every
    option left None (``train_options.fill_defaults``; steps / topk from ``served``, the serving
    trace's contract). Options are checked first (``check_train_options``).

    ``extra_defaults``: more ``defaults_used`` entries (how prompts were tokenized).
    ``trainer``: compute the draft forward with this trainer's own model (``replay.trainers``);
    None or ``specdiff``: the reference forward. The reference draft is loaded either way (its
    parsed config and facts are the draft's contract facts). ``draft_window``: ``LoadedDraft.serve_window``.
    ``target``: a target already at hand that holds its hidden states (record_features' ``FeatureTarget``),
    used instead of loading one; ``aux``: its layers (a ``TrainAux``), used instead of resolving the
    training layers (``aux_layers`` / ``aux_convention`` then only said where they came from).
    ``device_map``: load the transformers target with it (``load_target``) instead of moving it to ``device``;
    kept in ``engine_options.device_map``.

    Raises:
        RecordTrainError / CheckpointError / TargetError: one line each.
    """
    check_train_options(aux_layers=aux_layers, aux_convention=aux_convention, steps=steps, topk=topk, dtype=dtype,
                        target_dtype=target_dtype, capture=capture, probe_positions=probe_positions,
                        max_new_tokens=max_new_tokens, batch_size=batch_size, device=device, trainer=trainer)
    served = dict(served or {})
    target_dir, draft_dir = Path(target_dir), Path(draft_dir)
    opts, defaults_used = fill_defaults(
        {"steps": steps, "topk": topk, "dtype": dtype, "target_dtype": target_dtype, "capture": capture,
         "probe_positions": probe_positions, "max_new_tokens": max_new_tokens, "batch_size": batch_size,
         "device": device}, served, cuda_available=torch.cuda.is_available())
    ddtype = _parse_dtype(opts["dtype"], "--dtype")
    tdtype = _parse_dtype(opts["target_dtype"], "--target-dtype")

    quiet_transformers()
    if device_map is not None:  # engine_options.device_map: how the target was spread, as given
        opts["device_map"] = device_map
    if target is None and device_map is not None:
        target = load_target(target_dir, dtype=tdtype, device_map=device_map)
    elif target is None:
        target = load_target(target_dir, dtype=tdtype).to(opts["device"])
    L = target_num_layers(target)
    loaded = load_draft(draft_dir, dtype=ddtype, target_embedding=target_embedding(target),
                        target_lm_head=target_lm_head(target))
    loaded.model.to(opts["device"])  # nn.Module.to moves the module in place
    if draft_window is not None:
        loaded.serve_window(draft_window)
    given_aux, aux = aux, aux or resolve_train_aux(loaded, L, aux_layers, aux_convention,
                                                   architecture=target_architecture(target.config.to_dict()))
    defaults_used = {**({} if given_aux else _aux_defaults(aux_layers, aux_convention, loaded, aux)), **defaults_used,
                     **(extra_defaults or {}),
                     **{f"draft_config.{k}": v for k, v in loaded.config.defaults_used.items()}}
    if int(opts["topk"]) > loaded.config.draft_vocab_size:
        raise RecordTrainError(f"topk {opts['topk']} exceeds the draft vocab {loaded.config.draft_vocab_size}")
    pad_id = getattr(target.config, "pad_token_id", None)
    rep = TrainReplayer(target, loaded.model, aux, steps=int(opts["steps"]), topk=int(opts["topk"]),
                        capture=opts["capture"], probe_positions=int(opts["probe_positions"]),
                        pad_id=int(pad_id) if pad_id is not None else 0)
    side = TrainSide(target_dir, draft_dir, target, loaded, aux, rep, opts, defaults_used, served)
    if trainer not in (None, DEFAULT_TRAINER):
        side.trainer = rep.draft = load_trainer_draft(trainer, target_dir=target_dir, loaded=loaded, dtype=ddtype,
                                                      device=opts["device"], aux_hf_indices=aux.hf_indices)
    return side


def record_train(target_dir: str | Path, draft_dir: str | Path, out: str, *,
                 replay: str | None = None, prompts: str | Path | None = None,
                 aux_layers=None, aux_convention: str | None = None, steps: int | None = None,
                 topk: int | None = None, dtype: str | None = None, target_dtype: str | None = None,
                 capture: str | None = None, probe_positions: int | None = None,
                 max_new_tokens: int | None = None, batch_size: int | None = None,
                 max_batch_tokens: int = 8192, overwrite: bool = False, device: str | None = None,
                 trainer: str | None = None, draft_window: int | None = None, noise_floor: bool = True,
                 specforge_checkpoint=None, specforge_config=None, device_map: str | None = None,
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
        device: torch device of both models (default: cuda when torch sees one, else cpu:
            ``train_options.default_device``; the contract's ``engine_options.device`` holds it).
        capture: ``default`` (top-8 logits + logsumexp) or ``full`` (all draft logits).
        probe_positions: every HF hidden state is recorded at the first this-many positions.
        progress: called with the number of sequences finished after each batch.
        on_start: called once with (total sequences, a result stub holding aux, notes and
            defaults_used).
        trainer: ``specdiff`` (default, the reference forward), ``specforge`` or ``speculators``:
            the draft built, loaded and run by that trainer's installed package (``replay.trainers``).
        draft_window: the draft attends as SGLang serves it with ``--speculative-draft-window-size``.
        noise_floor: measure the floor a shift is judged against (replay/record/noise_floor.py; False: not).
        specforge_checkpoint / specforge_config: SpecForge's checkpoint and run config to read (specforge_contract).
        device_map: ``from_pretrained``'s device_map for the target (``auto``: spread over devices), as given.

    Raises:
        RecordTrainError / CheckpointError / TargetError / TraceError: one line each.
    """
    if (replay is None) == (prompts is None):
        raise RecordTrainError("give exactly one of --replay SERVE_TRACE or --prompts FILE.jsonl")
    check_train_options(aux_layers=aux_layers, aux_convention=aux_convention, steps=steps, topk=topk, dtype=dtype,
                        target_dtype=target_dtype, capture=capture, probe_positions=probe_positions,
                        max_new_tokens=max_new_tokens, batch_size=batch_size, replay=replay, device=device,
                        trainer=trainer)
    served: dict = {}
    token_defaults: dict[str, dict] = {}
    if replay is not None:
        seqs, served = sequences_from_trace(replay)
    else:
        seqs = sequences_from_prompts(prompts, Path(target_dir), defaults_used=token_defaults)
    if not overwrite and Path(str(out)).exists():
        raise RecordTrainError(f"{out}: already exists; choose another path or pass --overwrite")
    specforge = read_specforge(draft_dir, checkpoint=specforge_checkpoint, config=specforge_config)
    side = load_train_side(target_dir, draft_dir, served=served, aux_layers=aux_layers, aux_convention=aux_convention,
                           steps=steps, topk=topk, dtype=dtype, target_dtype=target_dtype, capture=capture,
                           probe_positions=probe_positions, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           device=device, extra_defaults=token_defaults, trainer=trainer, draft_window=draft_window,
                           device_map=device_map)
    side.specforge = specforge
    if int(side.options["max_new_tokens"]) > 0:
        seqs = extend_greedy(side.target, seqs, int(side.options["max_new_tokens"]))
    return write_train_trace(side, seqs, str(out), replay=replay, overwrite=overwrite,
                             max_batch_tokens=max_batch_tokens, noise_floor=noise_floor, progress=progress,
                             on_start=on_start)
