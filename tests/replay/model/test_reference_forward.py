"""The reference EAGLE-3 draft forward against an obviously-right per-token loop.

The loop below shares nothing with replay/model/draft_model.py but the weights: plain Python loops
over rows, float64, rope written out per rotation pair, attention over an explicit list of
visible keys (depth-0 rows s <= t, plus this row's keys at depths 1..k: SpecForge
llama3_eagle.py cache_hidden semantics).
"""

from __future__ import annotations

import math

import pytest
import torch

from specdiff.eagle3.norms import NORMS_OFF
from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig, ttt_labels


def _cfg(**kw):
    base = dict(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=40, draft_vocab_size=16, target_hidden_size=24, num_aux=3,
                rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None, **NORMS_OFF)
    base.update(kw)
    base.setdefault("head_dim", base["hidden_size"] // base["num_attention_heads"])
    return Eagle3DraftConfig(**base)


def _randomize(model: Eagle3Draft, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
        model.d2t.copy_(torch.randint(0, 10, model.d2t.shape, generator=g))


def _rms(x, w, eps):
    return w * (x / math.sqrt(float((x * x).mean()) + eps))


def _rope(vec, pos, theta, rotary_dim=None, neox=True):
    """Rotate one head vector [head_dim] at position pos over its first ``rotary_dim`` dims (the
    rest unchanged; SGLang 0.5.23 llama.py:199-200 partial_rotary_factor): pairs (i, i + r/2) in
    the HF rotate_half (neox) layout, pairs (2i, 2i+1) in the gptj layout; angle pos * theta^(-2i/r)."""
    r = vec.shape[0] if rotary_dim is None else rotary_dim
    out = vec.clone()
    for i in range(r // 2):
        ang = pos * theta ** (-2.0 * i / r)
        ia, ib = (i, i + r // 2) if neox else (2 * i, 2 * i + 1)
        a, b = vec[ia], vec[ib]
        out[ia] = a * math.cos(ang) - b * math.sin(ang)
        out[ib] = b * math.cos(ang) + a * math.sin(ang)
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
                rope = dict(rotary_dim=int(c.partial_rotary_factor * hd), neox=c.rope_is_neox_style)
                q = torch.stack([_rope(q[i * hd:(i + 1) * hd], pos, c.rope_theta, **rope) for i in range(nh)])
                k = torch.stack([_rope(k[i * hd:(i + 1) * hd], pos, c.rope_theta, **rope) for i in range(nkv)])
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
                head = (sd["embed_tokens.weight"][:c.draft_vocab_size] if c.tie_word_embeddings
                        else sd["lm_head.weight"])
                logits = head @ normed
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
    # the rope keys SGLang 0.5.23 reads (llama.py:199, :335): half of each head rotated, interleaved pairs
    "partial_rotary_0.5": dict(partial_rotary_factor=0.5),
    "gptj_style": dict(rope_is_neox_style=False),
    "partial_gptj_theta": dict(partial_rotary_factor=0.5, rope_is_neox_style=False, rope_theta=500000.0),
    "tied_lm_head": dict(tie_word_embeddings=True),
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
                                               msg=lambda m, w=f"{name} b={b} t={t} d={d}": f"{w}: {m}")
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


def _rows(batch):
    """tracer.rows.RowBatch -> name -> namespace(values, seq, pos, depth) as torch tensors."""
    from types import SimpleNamespace
    return {name: SimpleNamespace(values=v, seq=torch.as_tensor(s), pos=torch.as_tensor(p), depth=torch.as_tensor(d))
            for name, (v, s, p, d, _it) in batch.collected().items()}


def test_trace_rows_of_a_ttt_forward_follow_the_eagle3_pairing():
    from specdiff.tracer.rows import RowBatch, RowLayout, ttt_rows
    model = Eagle3Draft(_cfg())
    _randomize(model)
    aux, ids = torch.randn(2, 6, 72), torch.randint(0, 40, (2, 6))
    out = model.ttt_forward(aux, ids, 2, lengths=torch.tensor([6, 4]))
    batch = RowBatch()
    ttt_rows(batch, RowLayout.padded([0, 1], torch.tensor([6, 4])), out, level="full", topk=2,
             hot_token_id=model.hot_token_id(), argmax=ids)
    rows = _rows(batch)
    assert set(rows) == {"draft.fc_in", "draft.fc_out", "tokens", "draft.hidden_in", "draft.positions",
                         "draft.attn_in", "draft.hidden_out", "draft.logits", "draft.topk", "draft.topk_target",
                         "draft.accept", "draft.accept_cum", "draft.input_ids"}
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
    ps = rows["draft.positions"]
    assert ps.values.dtype == torch.int64 and (ps.values == ps.pos.long() + ps.depth.long()).all()  # rope at t+k
    # accept at (t, k): mapped top-1 == the label at t+1+k (here argmax = the tokens themselves)
    acc, tkt = rows["draft.accept"], rows["draft.topk_target"]
    want = tkt.values[:, 0] == ids[acc.seq.long(), acc.pos.long() + 1 + acc.depth.long()]
    assert torch.equal(acc.values, want)
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


# ---- checkpoints (replay/model/checkpoint.py) -------------------------------------------------
import json  # noqa: E402

from safetensors.torch import load_file, save_file  # noqa: E402

from specdiff.replay.model.checkpoint import CheckpointError, load_draft, save_draft  # noqa: E402
from specdiff.tracer.errors import SpecdiffError  # noqa: E402


def _ckpt_model(**kw):
    cfg = _cfg(**{"norm_before_fc": True, "fc_norm": True, "eagle_aux_hidden_state_layer_ids": [-1, 3, 5],
                  "aux_convention": "sglang", **kw})
    model = Eagle3Draft(cfg)
    _randomize(model, seed=7)
    with torch.no_grad():
        model.t2d[:16] = True
    return model


def _same_outputs(a: Eagle3Draft, b: Eagle3Draft):
    g = torch.Generator().manual_seed(3)
    aux = torch.randn(2, 5, a.config.aux_width, generator=g)
    ids = torch.randint(0, a.config.vocab_size, (2, 5), generator=g)
    oa, ob = a.ttt_forward(aux, ids, 3), b.ttt_forward(aux, ids, 3)
    for d in range(3):
        torch.testing.assert_close(oa.logits[d], ob.logits[d], rtol=0, atol=0)


def test_specforge_round_trip(tmp_path):
    model = _ckpt_model()
    save_draft(model, tmp_path, "specforge")
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["architectures"] == ["LlamaForCausalLMEagle3"]
    assert conf["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 3, 5]
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "embed_tokens.weight" not in keys and "midlayer.hidden_norm.weight" in keys
    assert {"d2t", "t2d", "fc.weight", "input_norm.weight", "fc_norm.2.weight"} <= keys
    loaded = load_draft(tmp_path, target_embedding=model.embed_tokens.weight)
    assert loaded.format == "specforge" and loaded.config.settings() == model.config.settings()
    # the specforge writer leaves out only the flags SpecForge would misread when false
    assert set(loaded.config.defaults_used) == {"norm_output", "norm_before_residual"}
    assert loaded.model.embed_source == "target" and loaded.model.lm_head_source == "draft"
    _same_outputs(model, loaded.model)
    facts = loaded.contract_facts(num_layers=8)
    assert facts["aux_hf_indices"] == [0, 4, 6] and facts["aux_convention"] == "sglang"
    assert facts["norm_before_fc"] and facts["fc_norm"] and facts["d2t_sha256"] and facts["t2d_sha256"]
    from specdiff.tracer.contract import validate_contract
    validate_contract(facts, where="test")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_target_embedding_loads_the_same_in_the_targets_dtype_as_in_float32(tmp_path, dtype):
    # record train hands the target's embedding (and lm_head, copied by the same _copy_target_weight) over in
    # the target's own dtype: a float32 copy of each (V*H*4 bytes: 2.1 GB at a Llama-3-8B vocab) held the same
    # values, since bf16 -> fp32 is exact
    model = _ckpt_model()
    save_draft(model, tmp_path, "specforge")
    emb = torch.randn(model.config.vocab_size, model.config.hidden_size).to(torch.bfloat16)
    wide = load_draft(tmp_path, dtype=dtype, target_embedding=emb.float())
    narrow = load_draft(tmp_path, dtype=dtype, target_embedding=emb)
    assert narrow.model.embed_source == "target"
    a, b = wide.model.state_dict(), narrow.model.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)
    assert torch.equal(b["embed_tokens.weight"].float(), emb.float().to(dtype).float())


def test_speculators_round_trip_converts_ids(tmp_path):
    # speculators refuses norm_before_fc with fc_norm (tests/replay/model/test_draft_config.py): one of them here
    model = _ckpt_model(norm_before_residual=True, norm_before_fc=False)
    with pytest.raises(CheckpointError, match="target_num_layers"):
        save_draft(model, tmp_path / "x", "speculators")
    save_draft(model, tmp_path, "speculators", target_num_layers=8, verifier="/models/target")
    conf = json.loads((tmp_path / "config.json").read_text())
    assert conf["eagle_aux_hidden_state_layer_ids"] == [0, 4, 6]  # vLLM convention = HF index
    assert conf["speculators_config"]["verifier"]["name_or_path"] == "/models/target"
    keys = set(load_file(str(tmp_path / "model.safetensors")))
    assert "layers.0.self_attn.q_proj.weight" in keys and "embed_tokens.weight" in keys
    loaded = load_draft(tmp_path)
    assert loaded.format == "speculators" and loaded.verifier == "/models/target"
    assert loaded.model.embed_source == "draft" and loaded.config.norm_before_residual
    _same_outputs(model, loaded.model)
    facts = loaded.contract_facts(num_layers=8)
    assert facts["aux_hf_indices"] == [0, 4, 6] and facts["aux_convention"] == "speculators"
    spec = load_draft(_resave(model, tmp_path / "sf"), target_embedding=model.embed_tokens.weight)
    assert spec.weights_sha256 == loaded.weights_sha256  # same weights, same hash, either format


def _resave(model, path):
    save_draft(model, path, "specforge")
    return path


def _tamper(path, drop=(), add=None, replace=None):
    f = path / "model.safetensors"
    sd = load_file(str(f))
    for k in drop:
        del sd[k]
    sd.update(add or {})
    sd.update(replace or {})
    save_file(sd, str(f))


def test_missing_and_unexpected_keys_are_named(tmp_path):
    save_draft(_ckpt_model(), tmp_path, "specforge")
    _tamper(tmp_path, drop=["midlayer.hidden_norm.weight"], add={"midlayer.extra_proj.weight": torch.zeros(2)})
    with pytest.raises(CheckpointError) as e:
        load_draft(tmp_path)
    msg = str(e.value)
    assert isinstance(e.value, SpecdiffError) and "\n" not in msg
    assert "missing keys: midlayer.hidden_norm.weight" in msg
    assert "unexpected keys: midlayer.extra_proj.weight" in msg


def test_wrong_fc_width_is_explained(tmp_path):
    model = Eagle3Draft(_cfg(hidden_size=256, num_attention_heads=4, target_hidden_size=256))
    save_draft(model, tmp_path, "specforge")
    _tamper(tmp_path, replace={"fc.weight": torch.zeros(256, 512)})
    with pytest.raises(CheckpointError, match=r"fc\.weight is \[256, 512\] but 3 aux slots x target "
                                              r"hidden 256 = 768"):
        load_draft(tmp_path)


def test_sglang_style_names_and_notes(tmp_path):
    model = _ckpt_model()
    save_draft(model, tmp_path, "specforge")
    sd = load_file(str(tmp_path / "model.safetensors"))
    legacy = {}
    for k, v in sd.items():
        k = k.replace("midlayer.", "layers.0.").replace("fc_norm.0", "aux_norm_low")
        legacy["model." + k if k.startswith("layers") else k] = v
    legacy["d2t"] = torch.arange(model.config.draft_vocab_size)  # direct-ids-looking d2t
    save_file(legacy, str(tmp_path / "model.safetensors"))
    conf = json.loads((tmp_path / "config.json").read_text())
    conf["eagle_aux_hidden_state_layer_ids"] = conf.pop("eagle_config").pop("eagle_aux_hidden_state_layer_ids")
    conf["eagle_config"] = {"norm_before_fc": True}
    (tmp_path / "config.json").write_text(json.dumps(conf))
    loaded = load_draft(tmp_path)
    assert loaded.config.eagle_aux_hidden_state_layer_ids is None  # SGLang reads eagle_config only
    notes = " | ".join(loaded.notes)
    assert "ignored by SGLang" in notes and "d2t equals arange" in notes and "embedding is random" in notes
    assert loaded.contract_facts(num_layers=8)["aux_hf_indices"] == [2, 4, 5]  # the default capture
    torch.testing.assert_close(loaded.model.fc_norm[0].weight, model.fc_norm[0].weight)


def test_bad_config_and_bin_weights(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(CheckpointError, match="not an EAGLE-3 draft"):
        load_draft(tmp_path)
    model = _ckpt_model()
    save_draft(model, tmp_path, "specforge")
    sd = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    torch.save(sd, tmp_path / "pytorch_model.bin")
    loaded = load_draft(tmp_path, target_embedding=model.embed_tokens.weight)
    _same_outputs(model, loaded.model)


# ---- target capture (replay/model/target_capture.py) -----------------------------------------
def _tiny_target(path):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=24, intermediate_size=48, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=40, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(str(path))
    return path


def test_target_capture_and_draft_on_top(tmp_path):
    from specdiff.eagle3.aux_layers import resolve_aux_ids
    from specdiff.replay.model.target_capture import (
        TargetError,
        capture_target,
        load_target,
        target_embedding,
        target_num_layers,
    )

    target = load_target(_tiny_target(tmp_path / "target"), dtype=torch.float32)
    L = target_num_layers(target)
    res = resolve_aux_ids([3, -1, 1], convention="sglang", num_layers=L)
    ids = torch.randint(0, 40, (2, 7), generator=torch.Generator().manual_seed(1))
    cap = capture_target(target, ids, res.hf_indices, lengths=torch.tensor([7, 5]), keep_all=True)
    assert cap.hf_indices == (0, 2, 4)
    for j, i in enumerate(cap.hf_indices):
        assert torch.equal(cap.aux[j], cap.hidden_states[i])
    assert torch.equal(cap.aux[0], target.get_input_embeddings()(ids))  # slot 0 = embeddings
    torch.testing.assert_close(cap.aux_cat[..., 24:48], cap.hidden_states[2])
    for b in range(2):  # causal + right padding: the first 5 positions match a solo run
        solo = target(input_ids=ids[b:b + 1, :5]).logits.argmax(-1)[0]
        assert torch.equal(cap.argmax[b, :5], solo)
    from specdiff.tracer.rows import RowBatch, RowLayout, target_rows
    batch = RowBatch()
    target_rows(batch, RowLayout.padded([0, 1], cap.lengths), aux=cap.aux, aux_cat=cap.aux_cat, argmax=cap.argmax)
    rows = _rows(batch)
    assert rows["target.aux.1"].values.shape == (12, 24) and rows["target.argmax"].values.shape == (12,)
    torch.testing.assert_close(rows["target.aux.1"].values[7], cap.aux[1][1, 0])  # row 7 = (seq 1, pos 0)
    with pytest.raises(TargetError, match="outside 0..6"):
        capture_target(target, ids, [7])
    # the draft runs on the captured features with the target's embedding
    draft = Eagle3Draft(_cfg(hidden_size=24, target_hidden_size=24, num_attention_heads=4, vocab_size=40))
    draft.set_target_embedding(target_embedding(target))
    out = draft.ttt_forward(cap.aux_cat, ids, 3, lengths=cap.lengths)
    assert out.logits[2].shape == (2, 7, 16) and draft.embed_source == "target"


@pytest.mark.parametrize("scaling", [None, {"rope_type": "linear", "factor": 2.0},
                                     {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64}])
def test_rope_frequencies_match_transformers(scaling):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from specdiff.replay.model.draft_model import rope_inv_freq
    params = dict(scaling or {"rope_type": "default"}, rope_theta=500000.0)
    cfg = LlamaConfig(hidden_size=256, num_attention_heads=4, rope_parameters=params)
    kind = params["rope_type"]
    if kind == "default":
        want = 1.0 / (500000.0 ** (torch.arange(0, 64, 2).float() / 64))
    else:
        want, _ = ROPE_INIT_FUNCTIONS[kind](cfg, "cpu")
    torch.testing.assert_close(rope_inv_freq(64, 500000.0, scaling), want.float(), rtol=1e-6, atol=1e-7)


def test_partial_rotary_leaves_the_unrotated_dims_alone_and_changes_the_output():
    """partial_rotary_factor 0.5: the forward differs from full rope (so the key is honoured), and
    rotating at another position changes only the first rotary_dim dims of q / k."""
    full = Eagle3Draft(_cfg())
    _randomize(full)
    half = Eagle3Draft(_cfg(partial_rotary_factor=0.5))
    half.load_state_dict(full.state_dict())
    aux, ids = torch.randn(1, 6, 72), torch.randint(0, 40, (1, 6))
    assert not torch.allclose(full.ttt_forward(aux, ids, 2).hidden_out[1], half.ttt_forward(aux, ids, 2).hidden_out[1],
                              rtol=1e-3, atol=1e-3)
    attn_in = torch.randn(1, 3, 64)
    q0, k0, _ = half._qkv(attn_in, torch.zeros(1, 3, dtype=torch.int64))
    q5, k5, _ = half._qkv(attn_in, torch.full((1, 3), 5, dtype=torch.int64))
    r = half.config.rotary_dim
    assert r == 4 and torch.equal(q0[..., r:], q5[..., r:]) and torch.equal(k0[..., r:], k5[..., r:])
    assert not torch.allclose(q0[..., :r], q5[..., :r])


@pytest.mark.parametrize("bad", [0.0, 1.5, 0.1])
def test_a_partial_rotary_factor_the_forward_cannot_use_is_refused(bad):
    from specdiff.replay.model.draft_config import DraftConfigError

    with pytest.raises(DraftConfigError, match="partial_rotary_factor"):
        _cfg(partial_rotary_factor=bad)  # 0.1 x head_dim 8 rotates 0 dims
