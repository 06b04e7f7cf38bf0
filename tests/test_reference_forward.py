"""The reference EAGLE-3 draft forward against an obviously-right per-token loop.

The loop below shares nothing with replay/draft_model.py but the weights: plain Python loops
over rows, float64, rope written out per rotation pair, attention over an explicit list of
visible keys (depth-0 rows s <= t, plus this row's keys at depths 1..k: SpecForge
llama3_eagle.py cache_hidden semantics).
"""

from __future__ import annotations

import math

import pytest
import torch

from specdiff.replay.draft_model import Eagle3Draft, Eagle3DraftConfig, ttt_labels


def _cfg(**kw):
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=40, draft_vocab_size=16, target_hidden_size=24, num_aux=3,
                rms_norm_eps=1e-5, rope_theta=10000.0)
    base.update(kw)
    return Eagle3DraftConfig(**base)


def _randomize(model: Eagle3Draft, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
        model.d2t.copy_(torch.randint(0, 10, model.d2t.shape, generator=g))


def _rms(x, w, eps):
    return w * (x / math.sqrt(float((x * x).mean()) + eps))


def _rope(vec, pos, theta):
    """Rotate one head vector [d] at position pos: pairs (i, i + d/2), HF rotate_half layout."""
    d = vec.shape[0]
    out = vec.clone()
    for i in range(d // 2):
        ang = pos * theta ** (-2.0 * i / d)
        a, b = vec[i], vec[i + d // 2]
        out[i] = a * math.cos(ang) - b * math.sin(ang)
        out[i + d // 2] = b * math.cos(ang) + a * math.sin(ang)
    return out


def reference_loop(model: Eagle3Draft, aux_cat, input_ids, steps, pad_id=0):
    """Per-row float64 loop. Returns dict depth -> {name: [B][T] tensors}."""
    c = model.config
    sd = {k: v.detach().double() for k, v in model.state_dict().items()}
    eps, hd, nh, nkv = c.rms_norm_eps, c.head_dim, c.num_attention_heads, c.num_key_value_heads
    B, T = input_ids.shape
    out = {}
    for b in range(B):
        fc_out = []
        for t in range(T):
            x = aux_cat[b, t].double()
            if c.norm_before_fc:
                x = _rms(x, sd["input_norm.weight"], eps)
            if c.fc_norm:
                H = c.target_hidden_size
                x = torch.cat([_rms(x[j * H:(j + 1) * H], sd[f"fc_norm.{j}.weight"], eps)
                               for j in range(c.num_aux)])
            out.setdefault("fc_in", {})[(b, t)] = x
            fc_out.append(sd["fc.weight"] @ x)
            out.setdefault("fc_out", {})[(b, t)] = fc_out[-1]
        keys, vals = {}, {}
        hidden = fc_out
        for d in range(steps):
            rows = []
            for t in range(T):
                tok = int(input_ids[b, t + 1 + d]) if t + 1 + d < T else pad_id
                emb = sd["embed_tokens.weight"][tok]
                h = hidden[t]
                attn_in = torch.cat([_rms(emb, sd["midlayer.input_layernorm.weight"], eps),
                                     _rms(h, sd["midlayer.hidden_norm.weight"], eps)])
                q = sd["midlayer.self_attn.q_proj.weight"] @ attn_in
                k = sd["midlayer.self_attn.k_proj.weight"] @ attn_in
                v = sd["midlayer.self_attn.v_proj.weight"] @ attn_in
                pos = t + d
                q = torch.stack([_rope(q[i * hd:(i + 1) * hd], pos, c.rope_theta) for i in range(nh)])
                k = torch.stack([_rope(k[i * hd:(i + 1) * hd], pos, c.rope_theta) for i in range(nkv)])
                keys[(d, t)], vals[(d, t)] = k, v.view(nkv, hd)
                rows.append((tok, h, attn_in, q))
            new_hidden = []
            for t in range(T):
                tok, h, attn_in, q = rows[t]
                visible = [(0, s) for s in range(t + 1)] + [(i, t) for i in range(1, d + 1)]
                heads = []
                for i in range(nh):
                    kv = i // (nh // nkv)
                    scores = torch.tensor([float(q[i] @ keys[key][kv]) / math.sqrt(hd) for key in visible],
                                          dtype=torch.float64)
                    p = torch.softmax(scores, 0)
                    heads.append(sum(p[j] * vals[key][kv] for j, key in enumerate(visible)))
                attn = sd["midlayer.self_attn.o_proj.weight"] @ torch.cat(heads)
                residual = _rms(h, sd["midlayer.hidden_norm.weight"], eps) if c.norm_before_residual else h
                h1 = residual + attn
                z = _rms(h1, sd["midlayer.post_attention_layernorm.weight"], eps)
                g = sd["midlayer.mlp.gate_proj.weight"] @ z
                mlp = sd["midlayer.mlp.down_proj.weight"] @ (g * torch.sigmoid(g) * (sd["midlayer.mlp.up_proj.weight"] @ z))
                hout = h1 + mlp
                normed = _rms(hout, sd["norm.weight"], eps)
                logits = sd["lm_head.weight"] @ normed
                for name, val in (("tokens", torch.tensor(tok)), ("hidden_in", h), ("attn_in", attn_in),
                                  ("hidden_out", hout), ("logits", logits)):
                    out.setdefault(name, {})[(b, t, d)] = val
                new_hidden.append(normed if c.norm_output else hout)
            hidden = new_hidden
    return out


CASES = {
    "plain": {},
    "norms": dict(norm_before_fc=True, fc_norm=True),
    "mha_norm_output": dict(num_key_value_heads=4, norm_output=True),
    "norm_before_residual": dict(norm_before_residual=True, num_key_value_heads=1),
}


@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("case", list(CASES))
def test_ttt_forward_matches_per_token_loop(case, steps):
    cfg = _cfg(**CASES[case])
    model = Eagle3Draft(cfg)
    _randomize(model, seed=steps)
    g = torch.Generator().manual_seed(100 + steps)
    B, T = 2, 6
    aux = torch.randn(B, T, cfg.aux_width, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    got = model.ttt_forward(aux, ids, steps)
    ref = reference_loop(model, aux, ids, steps)
    tol = dict(rtol=1e-4, atol=1e-4)
    for b in range(B):
        for t in range(T):
            torch.testing.assert_close(got.fc_in[b, t].double(), ref["fc_in"][(b, t)], **tol)
            torch.testing.assert_close(got.fc_out[b, t].double(), ref["fc_out"][(b, t)], **tol)
            for d in range(steps):
                assert int(got.tokens[d][b, t]) == int(ref["tokens"][(b, t, d)])
                for name in ("hidden_in", "attn_in", "hidden_out", "logits"):
                    torch.testing.assert_close(getattr(got, name)[d][b, t].double(),
                                               ref[name][(b, t, d)], **tol,
                                               msg=lambda m: f"{name} b={b} t={t} d={d}: {m}")
    # ids: draft top-1 and its target mapping
    for d in range(steps):
        ref_top = torch.stack([torch.stack([ref["logits"][(b, t, d)].argmax() for t in range(T)])
                               for b in range(B)])
        assert torch.equal(got.topk(1)[d][..., 0], ref_top)
        assert torch.equal(got.topk_target(1)[d][..., 0], ref_top + model.d2t[ref_top])


def test_position_offset_does_not_change_outputs():
    model = Eagle3Draft(_cfg())
    _randomize(model)
    aux, ids = torch.randn(1, 5, 72), torch.randint(0, 40, (1, 5))
    a = model.ttt_forward(aux, ids, 3)
    b = model.ttt_forward(aux, ids, 3, position_offset=7)
    for d in range(3):
        torch.testing.assert_close(a.logits[d], b.logits[d], rtol=1e-4, atol=1e-4)


def test_right_padding_leaves_valid_rows_unchanged():
    model = Eagle3Draft(_cfg())
    _randomize(model)
    aux, ids = torch.randn(2, 7, 72), torch.randint(0, 40, (2, 7))
    aux[1], ids[1] = aux[0], ids[0]
    aux[1, 5:], ids[1, 5:] = 9.0, 3  # padding garbage after length 5
    out = model.ttt_forward(aux, ids, 3, lengths=torch.tensor([7, 5]))
    short = model.ttt_forward(aux[:1, :5], ids[:1, :5], 3)
    for d in range(3):
        v = out.valid[d][1]
        assert int(v.sum()) == max(0, 5 - 1 - d)
        torch.testing.assert_close(out.logits[d][1][v], short.logits[d][0][short.valid[d][0]])


def test_canonical_rows_and_labels():
    model = Eagle3Draft(_cfg())
    _randomize(model)
    aux, ids = torch.randn(2, 6, 72), torch.randint(0, 40, (2, 6))
    out = model.ttt_forward(aux, ids, 2, lengths=torch.tensor([6, 4]))
    rows = out.canonical_rows(topk=2)
    assert set(rows) == {"draft.fc_in", "draft.fc_out", "tokens", "draft.hidden_in", "draft.attn_in",
                         "draft.hidden_out", "draft.logits", "draft.topk", "draft.topk_target"}
    from specdiff.tracer.schema import spec_for
    for name in rows:
        spec_for(name)  # every name is canonical
    assert rows["draft.fc_out"].values.shape == (10, 32)
    lg = rows["draft.logits"]
    assert lg.values.shape[0] == (5 + 3) + (4 + 2)
    i = int(((lg.seq == 1) & (lg.pos == 1) & (lg.depth == 1)).nonzero())
    torch.testing.assert_close(lg.values[i], out.logits[1][1, 1].detach())
    tk = rows["tokens"]
    j = int(((tk.seq == 0) & (tk.pos == 2) & (tk.depth == 1)).nonzero())
    assert int(tk.values[j]) == int(ids[0, 4])  # x_{t+1+k}
    labels = ttt_labels(ids, 2, torch.tensor([6, 4]))
    assert int(labels[1][0, 2]) == int(ids[0, 4]) and int(labels[1][1, 2]) == -100


def test_training_step_is_differentiable_and_bf16_runs():
    model = Eagle3Draft(_cfg())
    aux, ids = torch.randn(2, 8, 72), torch.randint(0, 16, (2, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(15):
        out = model.ttt_forward(aux, ids, 2)
        labels = ttt_labels(ids, 2)
        loss = sum(torch.nn.functional.cross_entropy(lg.flatten(0, 1), lab.flatten(), ignore_index=-100)
                   for lg, lab in zip(out.logits, labels))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    out = model.to(torch.bfloat16).ttt_forward(aux, ids, 2)
    assert out.logits[1].dtype == torch.bfloat16 and torch.isfinite(out.logits[1].float()).all()
