"""``StageHooks`` (replay/trainers/stages.py) on a toy draft with two decoder layers: a layer output it
was asked to read is collected per depth, and a forward that never runs that layer is one clear error
naming the stage, not a KeyError."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdiff.replay.trainers.stages import StageHooks

PATHS = {"fc": "fc", "embed": "embed_tokens", "hidden_norm": "layers.0.hidden_norm",
         "attn": "layers.0.self_attn.q_proj", "norm": "norm", "lm_head": "lm_head"}


class _Layer(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.hidden_norm = nn.LayerNorm(h)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * h, h)

    def forward(self, emb, hidden):
        return self.self_attn.q_proj(torch.cat([emb, self.hidden_norm(hidden)], -1))


class _Toy(nn.Module):
    """fc -> per depth: embed, layer 0 (its own forward, or its parts only), layer 1, norm, lm_head."""

    def __init__(self, h: int = 8, v: int = 16):
        super().__init__()
        self.fc = nn.Linear(3 * h, h)
        self.embed_tokens = nn.Embedding(v, h)
        self.layers = nn.ModuleList([_Layer(h), _Layer(h)])
        self.norm = nn.LayerNorm(h)
        self.lm_head = nn.Linear(h, v)

    def forward(self, aux, ids, steps: int, *, skip_layer0_forward: bool = False):
        h = self.fc(aux)
        for _ in range(steps):
            emb = self.embed_tokens(ids)
            l0 = self.layers[0]
            h = (l0.self_attn.q_proj(torch.cat([emb, l0.hidden_norm(h)], -1)) if skip_layer0_forward
                 else l0(emb, h))
            h = self.layers[1](emb, h)
            self.lm_head(self.norm(h))


def _run(model, **kw):
    aux, ids = torch.randn(1, 5, 24), torch.randint(0, 16, (1, 5))
    rope = ("norm", lambda a, kw: torch.arange(5)[None])  # the positions, read once a depth
    with torch.no_grad(), StageHooks(model, PATHS, positions=rope, layers=("layers.0",)) as hooks:
        model(aux, ids, 2, **kw)
    return hooks, torch.tensor([5])


def test_each_depth_holds_layer_0s_output():
    model = _Toy()
    hooks, lengths = _run(model)
    out = hooks.output(lengths, torch.zeros(16, dtype=torch.int64))
    assert len(out.layer_out) == 2 and all(len(d) == 1 and d[0].shape == (1, 5, 8) for d in out.layer_out)


def test_a_forward_that_skips_a_recorded_layer_names_the_stage():
    hooks, lengths = _run(_Toy(), skip_layer0_forward=True)
    with pytest.raises(RuntimeError, match=r"depth 0: the trainer's forward did not run layer_out\.0"):
        hooks.output(lengths, torch.zeros(16, dtype=torch.int64))
