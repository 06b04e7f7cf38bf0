"""The training-side replayer: target with hidden states, the reference draft's TTT forward, and
the trace rows of each batch.

Owns the forward ``record train`` runs per batch (``TrainReplayer.forward``) and the rows it
writes (``TrainReplayer.rows``, built by ``specdiff.tracer.rows``, the row builder the training
hooks share), with the acceptance statistics of the contract (``specdiff.eagle3.acceptance``).
"""

from __future__ import annotations

import numpy as np
import torch

from specdiff.eagle3.acceptance import AcceptTally
from specdiff.eagle3.aux_layers import AuxResolution
from specdiff.replay.model.draft_model import Eagle3Draft, TTTOutput
from specdiff.replay.model.target_capture import TargetCapture, capture_target, target_num_layers
from specdiff.replay.record.sequences import TrainSequence
from specdiff.replay.record.train_options import CAPTURE_LEVELS
from specdiff.replay.trainers.errors import RecordTrainError
from specdiff.tracer.rows import TOPK_WIDTH, RowBatch, RowLayout, target_rows, ttt_rows
from specdiff.tracer.store import TraceWriter

__all__ = ["LOGITS_TOPK", "TrainReplayer"]

#: k of ``draft.logits_topk.*`` at capture level ``default``
LOGITS_TOPK = TOPK_WIDTH


class TrainReplayer:
    """Target + draft ready to replay batches; ``forward`` computes, ``write`` records.

    Args:
        target: HF causal LM (eval).
        draft: Eagle3Draft (eval, its dtype is the draft compute dtype).
        aux: the aux resolution (training layers); a ``TrainAux`` whose ``prenorm`` is (L,) reads
            that slot from the final norm's input (``capture_target``).
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
    def forward(self, input_ids: torch.Tensor, lengths: torch.Tensor,
                seqs: list[TrainSequence] | None = None) -> tuple[TargetCapture, TTTOutput]:
        """The bare forward: target with hidden states, then the draft's TTT forward. A target that
        holds its hidden states already (``capture_batch``: replay/record/feature_target.py, stored
        features) gives them for the batch's sequences ``seqs`` instead of running."""
        prenorm = getattr(self.aux, "prenorm", ())
        if hasattr(self.target, "capture_batch"):
            cap = self.target.capture_batch(input_ids, lengths, seqs, hf_indices=self.aux.hf_indices,
                                            prenorm=prenorm, top_logits=LOGITS_TOPK)
        else:
            cap = capture_target(self.target, input_ids, self.aux.hf_indices, lengths=lengths,
                                 keep_all=self.probe_positions > 0, prenorm=prenorm, top_logits=LOGITS_TOPK)
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
                    hidden_states=cap.hidden_states, probe_positions=self.probe_positions, logits_top=cap.logits_top)
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
