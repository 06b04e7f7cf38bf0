"""A radix-cached prefix carries an upstream difference into another sequence.

SGLang's radix cache serves a request whose prompt extends an earlier one from the earlier request's
KV (``Req.cached_tokens``; tracer/engines/sglang/prefill.py): the later request's first extended
position attends to keys and values the *earlier* request's forward computed. When that forward
took another MoE expert at a prefix position (a router near tie, named at an aux slot of the earlier
sequence), the later sequence's rows carry it from its very first recorded row, with no row of its
own before them to show it (the training side recomputes the whole prefix). Measured (a correct
DeepSeek-V3 pair, ``make test-seeds`` seed 2, prompt set b, whose second prompt extends the first):
a flip at ``target.aux.1`` seq 0 pos 3 moved seq 0's ``target.aux.2`` rows 4-14 (0.10 decaying to
0.05) and seq 1's first recorded rows, pos 10-13 after its 10 cached positions, by 0.064-0.056,
decaying after them: "not MoE routing near-ties: a run ... that does not fade out".

``CachedPrefixes.carried_in`` names, per aligned sequence whose serving prefix was cached, the
explained upstream row (another sequence's, at a position inside that prefix, the two sequences'
serving tokens equal up to it) that its cached keys and values carry; the routing judge then treats
the run starting at the sequence's first extended position as that row's carried tail
(judge/routing.py ``_after_upstream``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specdiff.replay.diff.types import serve_side


@dataclass(frozen=True)
class CachedPrefixes:
    """Serving's cached prefixes and tokens per aligned sequence.

    Attributes:
        cached: aligned pair -> cached prefix length, in aligned positions (judge/groups.py
            ``cached_prefixes``); pairs without a cached prefix are absent.
        tokens: aligned pair -> serving's tokens from the pair's aligned start (int [len]).
    """

    cached: dict[int, int]
    tokens: dict[int, np.ndarray]

    @classmethod
    def of(cls, traces, alignment, cached: dict[int, int]) -> CachedPrefixes:
        """From the traces' serving side (``types.serve_side``) and ``cached`` (``cached_prefixes``)."""
        trace = getattr(traces, serve_side(traces))
        attr = serve_side(traces)
        tokens = {}
        for p in alignment.seq_pairs:
            try:
                seq = trace.sequence(getattr(p.seq, attr))
            except KeyError:
                continue
            start = getattr(p.start, attr)
            tokens[p.index] = np.asarray(seq.tokens[start:start + p.length])
        return cls(dict(cached), tokens)

    def carried_in(self, upstream) -> dict[int, tuple[int, int, str]]:
        """pair -> (pair, pos, aux slot) of the first explained row of a target aux slot (``upstream``:
        ``inherited.Inheritance``) inside the pair's cached prefix, in another sequence whose serving
        tokens equal the pair's up to that position; pairs with none are absent."""
        flips = upstream.explained_flips()
        out: dict[int, tuple[int, int, str]] = {}
        for pair, c in self.cached.items():
            mine = self.tokens.get(pair)
            for q, r, slot in sorted(flips, key=lambda f: f[1]):
                other = self.tokens.get(q)
                if q == pair or r >= c or mine is None or other is None or len(mine) <= r or len(other) <= r:
                    continue
                if np.array_equal(mine[:r + 1], other[:r + 1]):
                    out[pair] = (q, r, slot)
                    break
        return out

    def carried_starts(self, upstream) -> dict[int, tuple[int, str]]:
        """pair -> (its first extended position, the aux slot of the flip its cached prefix carries),
        for the pairs ``carried_in`` names."""
        return {p: (self.cached[p], slot) for p, (_, _, slot) in self.carried_in(upstream).items()}


__all__ = ["CachedPrefixes"]
