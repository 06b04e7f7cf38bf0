"""The training side, loaded once (``TrainSide``): its contract facts, its trace, and its batches.

``record_train.load_train_side`` builds one (target, draft, training aux layers, filled-in options);
``record train`` replays every sequence through it and ``specdiff watch`` keeps one and replays each
served request as it ends. The facts that come from outside the rows are ``train_facts``; the
forward and its rows are ``replayer``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specdiff.eagle3.aux_layers import AuxResolution
from specdiff.replay.model.checkpoint import LoadedDraft
from specdiff.replay.model.target_capture import target_embedding
from specdiff.replay.record.replayer import LOGITS_TOPK, TrainReplayer
from specdiff.replay.record.sequences import TrainSequence, batches_by_length
from specdiff.replay.record.specforge_contract import SpecForgeRecord
from specdiff.replay.record.train_facts import (
    draft_computation_facts,
    live_facts,
    preflight_facts,
    prenorm_notes,
)
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.tracer.contract import known, target_identity_facts, validate_contract
from specdiff.tracer.contract_fields import DEFAULTS_USED
from specdiff.tracer.errors import TraceError
from specdiff.tracer.paths import recorded_path
from specdiff.tracer.store import TraceWriter

__all__ = ["TrainSide"]


def _sha256_file(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _version() -> str:
    try:
        from importlib.metadata import version
        return version("specdiff")
    except Exception:
        return "unknown"

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

