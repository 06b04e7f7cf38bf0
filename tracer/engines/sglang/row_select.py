"""The rows of the recorded requests of a SGLang batch that also holds requests the sampler left out.

Sampling (``SPECDIFF_SAMPLE``, ``SPECDIFF_RIDS``, the client's mark) chooses requests, but SGLang runs
them in batches: without this, an iteration holding one chosen request was copied whole to the host
and the writer dropped the other requests' rows. ``RowSelection`` picks the chosen requests' rows of
each tensor a hook copies, on the device, before the host copy, so the capture is a smaller batch
of the chosen requests only (``IterCapture.rids``, ``prefix_lens``, ``extend_lens`` are theirs) and
attribution reads it as any batch. Where every request is chosen no ``RowSelection`` exists and
the hooks copy as they always did.

Row layouts of the tensors the hooks copy (SGLang 0.5.23, worker v2, B requests):

- prefill (``ForwardMode.EXTEND``): token rows [sum(extend_lens), ...], request b's contiguous at
  ``sum(extend_lens[:b])`` (target aux, the draft extend's inputs, fc, midlayer taps); request rows
  [B, ...] (seq_lens, next_token_ids, the last-position logits and draft hidden, topk_index). Every
  ``extend_len`` is >= 1 (the last prompt token is always computed for its logits), so a tensor with
  sum(extend_lens) == B rows has one row a request in both readings.
- decode: B equal blocks of rows, request b's at ``b * m`` (m = rows / B): B (seq_lens, accept
  lengths), B x N verify rows (aux, target logits, predict, draft tokens, positions, the draft
  extend), B x topk draft-step rows, [B, N] tree tensors (retrieve_*), [B, steps + 1] accept_index.

``retrieve_index`` and ``accept_index`` hold absolute verify-row numbers (``b * N + j``,
speculative/eagle_utils.py:203-231 build_tree_kernel_efficient, :633-654 verify_tree_greedy; -1
for none): ``to_kept_rows`` renumbers them for the smaller batch, in the writer.
"""

from __future__ import annotations

import torch


def _runs(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``spans`` [(start, end)] in order, adjacent ones merged."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        elif b > a:
            out.append((a, b))
    return out


class RowSelection:
    """The rows of the kept requests ``keep`` (batch indices, ascending) of a batch of ``batch_size``.

    Args:
        keep: indices of the recorded requests in the engine's batch order (a proper subset).
        batch_size: the batch's request count B.
        extend_lens: a prefill's extend lengths (one per request), None for a decode.
    """

    def __init__(self, keep: list[int], batch_size: int, extend_lens: list[int] | None = None):
        self.keep = list(keep)
        self.batch_size = batch_size
        self.prefill = extend_lens is not None
        self._request_runs = _runs([(b, b + 1) for b in self.keep])
        self.tokens = None
        self._token_runs: list[tuple[int, int]] = []
        if extend_lens is not None:
            starts = [0]
            for e in extend_lens:
                starts.append(starts[-1] + int(e))
            self.tokens = starts[-1]
            self._token_runs = _runs([(starts[b], starts[b + 1]) for b in self.keep])
        self._index: dict = {}  # (device, rows) -> int64 index tensor on that device

    def rows(self, t: torch.Tensor) -> torch.Tensor:
        """The kept requests' rows of ``t`` (dim 0 in one of the module doc's layouts), in batch
        order, still on ``t``'s device: a view when they are one run of rows, else one
        ``index_select``. A tensor in none of the layouts (a scalar, a [1] constant) is returned as is."""
        n = t.shape[0] if t.dim() else 0
        B = self.batch_size
        if self.prefill:
            if n == self.tokens:
                runs = self._token_runs
            elif n == B:
                runs = self._request_runs
            else:
                return t
        elif n and n % B == 0:
            m = n // B
            runs = [(a * m, b * m) for a, b in self._request_runs]
        else:
            return t
        if len(runs) == 1:
            a, b = runs[0]
            return t[a:b]
        key = (t.device, n)
        idx = self._index.get(key)
        if idx is None:
            idx = torch.cat([torch.arange(a, b) for a, b in runs]).to(t.device)
            self._index[key] = idx
        return t.index_select(0, idx)


def to_kept_rows(index: torch.Tensor, batch_index: list[int], per_request: int) -> torch.Tensor:
    """``index`` [B', w] (request b' of the smaller batch in row b'), whose entries are absolute verify
    rows of the engine's batch (``batch_index[b'] * per_request + j``; negative: none), renumbered
    as rows of the smaller batch (``b' * per_request + j``). Returns a new int64 tensor."""
    out = index.to(torch.int64).reshape(len(batch_index), -1).clone()
    shift = torch.tensor([(b - k) * per_request for k, b in enumerate(batch_index)], dtype=torch.int64)[:, None]
    return torch.where(out >= 0, out - shift, out).reshape(index.shape)


__all__ = ["RowSelection", "to_kept_rows"]
