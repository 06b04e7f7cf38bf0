"""The ``aux_traces`` fixture (registered by tests/conftest.py): hand-built trace pairs with aux slots
for chosen HF indices, written through real ``TraceWriter`` stores."""

from __future__ import annotations

import numpy as np
import pytest


class AuxTraces:
    """Hand-built traces (real ``TraceWriter`` stores) with aux slots for chosen HF indices.

    One "hidden state" per HF index 0..L and position is drawn once (seed 0): two traces that name
    the same HF index hold the same values (plus ``noise``), so a layer shift, a permutation, a
    position shift or a d2t mistake is visible in the rows exactly as the diff engine sees it.
    Sizes: L = 8 layers, hidden H = 32 (float32), draft vocab VD = 16, sequences of 12 and 9 tokens.
    """

    L, H, VD = 8, 32, 16

    def __init__(self):
        rng = np.random.default_rng(0)
        self.SEQS = [rng.integers(0, 100, size=n) for n in (12, 9)]
        self.HIDDEN = {s: rng.standard_normal((self.L + 1, len(toks), self.H)).astype(np.float32)
                       for s, toks in enumerate(self.SEQS)}
        self.D2T = np.array(sorted(rng.choice(200, self.VD, replace=False)), np.int64) - np.arange(self.VD)

    def write(self, path, *, side, hf, seqs=None, order=None, noise: float | list = 1e-4, probes=False, d2t=None,
              topk_fn=None, nan_at=None, shift_pos=0, extra_seq=False, fc_in_norm=None, guess_wrong_at=(),
              facts: dict | None = None) -> str:
        """A trace at ``path`` holding aux slots for HF indices ``hf`` (in that slot order), tokens,
        draft top-k ids and their mapped target ids at depths 0 and 1; ``facts``: more contract facts;
        returns the path."""
        from specdiff.tracer.schema import aux_name, probe_name
        from specdiff.tracer.store import TraceWriter

        seqs = self.SEQS if seqs is None else seqs
        d2t = self.D2T if d2t is None else d2t
        L, H, VD, HIDDEN = self.L, self.H, self.VD, self.HIDDEN
        contract = {"num_layers": L, "hidden_size": H, "aux_hf_indices": list(hf), "dtype": "float32",
                    "draft_vocab_size": VD, "spec_steps": 2, **(facts or {})}
        with TraceWriter(str(path), side=side, contract=contract, overwrite=True) as w:
            order = order or list(range(len(seqs)))
            for s in order:
                toks = seqs[s]
                sid = w.add_sequence(toks, prompt_len=4, rid=f"{side}-{s}")
                n = len(toks) - 1
                pos = np.arange(n) + shift_pos
                for j, i in enumerate(hf):
                    eps = noise[j] if isinstance(noise, list) else noise
                    rows = HIDDEN[s][i, :n] + eps * np.random.default_rng(s * 10 + j).standard_normal((n, H))
                    rows = rows.astype(np.float32)
                    if nan_at is not None and j == 0:
                        rows[nan_at] = np.nan
                    w.append(aux_name(j), rows, seq=sid, pos=pos)
                if fc_in_norm is not None:
                    cat = np.concatenate([HIDDEN[s][i, :n] for i in hf], axis=1)
                    if fc_in_norm:
                        cat = cat / np.sqrt((cat * cat).mean(1, keepdims=True) + 1e-6)
                    w.append("draft.fc_in", cat.astype(np.float32), seq=sid, pos=pos)
                if probes:
                    for i in range(L + 1):
                        w.append(probe_name(i), HIDDEN[s][i, :n], seq=sid, pos=pos)
                for depth in range(2):
                    inputs = toks[1 + depth:1 + depth + n].astype(np.int64)[: n - depth].copy()
                    draft_ids = (toks[:n - depth] % VD).reshape(-1, 1).copy()
                    if depth and guess_wrong_at:  # serving drafted its own (wrong) token here
                        inputs[list(guess_wrong_at)] += 1
                        draft_ids[list(guess_wrong_at)] = (draft_ids[list(guess_wrong_at)] + 1) % VD
                    w.append("tokens", inputs, seq=sid, pos=np.arange(n - depth), depth=depth)
                    w.append("draft.topk", draft_ids, seq=sid, pos=np.arange(n - depth), depth=depth)
                    mapped = topk_fn(draft_ids, d2t) if topk_fn else draft_ids + d2t[draft_ids]
                    w.append("draft.topk_target", mapped, seq=sid, pos=np.arange(n - depth), depth=depth)
            w.append("draft.d2t", d2t, seq=-1, pos=np.arange(len(d2t)))  # a real draft's map is longer than VD
            if extra_seq:
                w.add_sequence([999, 998, 997], rid="lonely")
        return str(path)


@pytest.fixture(scope="session")
def aux_traces() -> AuxTraces:
    """:class:`AuxTraces`: ``aux_traces.write(path, side=..., hf=[...], ...)``."""
    return AuxTraces()
