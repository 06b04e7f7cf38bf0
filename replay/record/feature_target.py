"""The target side of a training trace recorded from stored features: the ``TargetCapture`` of each batch
built from the trainer's files instead of a target forward (``record train --features``).

``FeatureTarget`` takes the target's place in ``TrainReplayer`` (replay/record/replayer.py calls its
``capture_batch`` where it would run ``capture_target``): ``target.aux.{j}`` / ``target.aux_cat`` are the
stored aux hidden states as stored (slot j = columns j*H..(j+1)*H, the files' concat order), and
``target.argmax`` / ``target.logits_topk.*`` come from the stored last hidden state through the target's
lm_head (after its final norm where the file holds it before: speculators), as each trainer computes its
TTT labels (SpecForge's target head, speculators' ``verifier_lm_head(verifier_norm(.))``). No decoder layer
of the target exists here, so there are no layer probes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdiff.replay.model.target_capture import TargetCapture
from specdiff.replay.model.target_head import TargetHead
from specdiff.replay.record.feature_files import FeatureFile, FeatureSet
from specdiff.replay.record.sequences import TrainSequence
from specdiff.replay.trainers.errors import RecordTrainError

__all__ = ["FeatureSequence", "FeatureTarget", "feature_sequences"]


@dataclass
class FeatureSequence(TrainSequence):
    """A ``TrainSequence`` whose target side is one stored sample (``file``)."""

    file: FeatureFile | None = None


def feature_sequences(fs: FeatureSet) -> tuple[list[FeatureSequence], list[str]]:
    """One sequence per sample of ``fs`` with at least 2 tokens (rid: the file's name, or the rid the file
    holds), prompt_len = its length (the whole stored sequence is what the target computed on); and the
    notes (samples left out)."""
    seqs, short = [], []
    for f in fs.files:
        toks = fs.tokens(f)
        if len(toks) < 2:
            short.append(f.name)
            continue
        seqs.append(FeatureSequence(np.asarray(toks, np.int64), len(toks), f.name, None, file=f))
    notes = [f"{len(short)} stored samples have fewer than 2 tokens (no draft row): not replayed ({', '.join(short[:3])})"
             ] if short else []
    if not seqs:
        raise RecordTrainError(f"--features {fs.directory}: no stored sample has 2 tokens or more")
    return seqs, notes


class FeatureTarget(torch.nn.Module):
    """The stored features of ``fs`` and the target's ``TargetHead``, as ``TrainReplayer``'s target.

    Attributes:
        config: the target's transformers config (``TargetHead.config``).
        features: the ``FeatureSet``; slots: K; hidden: H.
    """

    def __init__(self, head: TargetHead, features: FeatureSet, *, slots: int, hidden: int):
        super().__init__()
        self.head, self.features, self.slots, self.hidden = head, features, int(slots), int(hidden)
        self.config = head.config
        self.specdiff_missing_keys: list[str] = []

    def get_input_embeddings(self):
        return self.head.get_input_embeddings()

    def get_output_embeddings(self):
        return self.head.get_output_embeddings()

    @torch.no_grad()
    def capture_batch(self, input_ids: torch.Tensor, lengths: torch.Tensor, seqs: list[FeatureSequence], *,
                      hf_indices, prenorm=(), top_logits: int = 0) -> TargetCapture:
        """The batch's ``TargetCapture`` from the files of ``seqs`` (right-padded to ``input_ids`` [B, T]).

        Raises:
            RecordTrainError: a file's tokens are not its sequence's (it changed since it was listed), or its
                aux width is not K*H.
        """
        B, T = input_ids.shape
        K, H = self.slots, self.hidden
        aux_cat = argmax = top_v = top_i = None
        for b, s in enumerate(seqs):
            got = self.features.read(s.file)
            n = int(lengths[b])
            if not np.array_equal(got.tokens, s.tokens) or n != len(got.tokens):
                raise RecordTrainError(f"{s.file.path}: its tokens changed while recording; record again")
            if got.aux_cat.shape[1] != K * H:
                raise RecordTrainError(f"{s.file.path}: aux width {got.aux_cat.shape[1]}, but the first file holds "
                                       f"{K} x {H} = {K * H}: the files disagree")
            if aux_cat is None:
                aux_cat = torch.zeros(B, T, K * H, dtype=got.aux_cat.dtype)
                argmax = torch.zeros(B, T, dtype=torch.int64)
                k = max(int(top_logits), 1)
                top_v, top_i = torch.zeros(B, T, k), torch.zeros(B, T, k, dtype=torch.int64)
            aux_cat[b, :n] = got.aux_cat.to(aux_cat.dtype)
            logits = self.head.logits(got.last_hidden, prenorm=got.last_prenorm)
            argmax[b, :n] = logits.argmax(-1).cpu()
            if top_logits:
                t = torch.topk(logits.float(), min(top_logits, logits.shape[-1]), dim=-1)
                top_v[b, :n], top_i[b, :n] = t.values.cpu(), t.indices.cpu()
        aux = [aux_cat[..., j * H:(j + 1) * H] for j in range(K)]
        return TargetCapture(input_ids=input_ids, lengths=lengths, hf_indices=tuple(hf_indices), aux=aux,
                             aux_cat=aux_cat, argmax=argmax, hidden_states=None, prenorm=tuple(prenorm),
                             logits_top=(top_v, top_i) if top_logits else None)
