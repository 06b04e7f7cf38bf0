"""record train (replay/record/record_train.py, `specdiff record train`) and training hooks
(tracer/training_hooks.py): trace contents, hooks vs the reference forward, detach, bad drafts."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

pytest.importorskip("transformers")

from safetensors.torch import load_file, save_file  # noqa: E402

from specdiff.eagle3.norms import NORMS_OFF  # noqa: E402
from specdiff.replay.model.checkpoint import save_draft  # noqa: E402
from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig  # noqa: E402
from specdiff.tracer.store import TraceWriter, open_trace  # noqa: E402
from specdiff.tracer.training_hooks import HookError, attach_recorder  # noqa: E402

torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parents[3]
DEMO = ROOT / "traces" / "models"
V = 4096


# ---- models -----------------------------------------------------------------------------
def _demo_models() -> tuple[Path, Path] | None:
    t, d = DEMO / "target", DEMO / "draft"
    if (t / "config.json").is_file() and (d / "config.json").is_file() and (t / "tokenizer.json").is_file():
        return t, d
    return None


def _draft_cfg(**kw):
    base = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, vocab_size=V, draft_vocab_size=128, target_hidden_size=32, num_aux=3,
                rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, **NORMS_OFF,
                eagle_aux_hidden_state_layer_ids=[-1, 2, 4], aux_convention="sglang")
    base.update(kw)
    return Eagle3DraftConfig(**base)


def _random_draft(seed=0, **kw) -> Eagle3Draft:
    d = Eagle3Draft(_draft_cfg(**kw))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        d.d2t.copy_(torch.arange(d.config.draft_vocab_size) * 3)  # offsets: draft i -> target 4i
        d.t2d[torch.arange(d.config.draft_vocab_size) * 4] = True
    return d


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """The committed demo pair when built, else a tiny random pair with the demo tokenizer."""
    demo = _demo_models()
    if demo is not None:
        return demo
    from transformers import LlamaConfig, LlamaForCausalLM
    out = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=6, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=V, max_position_embeddings=512,
                      bos_token_id=0, eos_token_id=1, pad_token_id=2)
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(str(out / "target"))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if (DEMO / "target" / f).is_file():
            shutil.copy(DEMO / "target" / f, out / "target" / f)
    save_draft(_random_draft(), out / "draft", "specforge")
    return out / "target", out / "draft"


@pytest.fixture(scope="module")
def prompts(tmp_path_factory, models) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    lines = [{"input_ids": [0, 17, 33, 51, 90, 12, 7, 300, 41, 42, 43, 44], "prompt_len": 5, "rid": "a"},
             {"input_ids": [0, 5, 6, 7, 8, 9, 10, 11], "rid": "b"}]
    if (models[0] / "tokenizer.json").is_file():
        lines.append({"prompt": "import os\n", "completion": "def main():\n    return os.getcwd()\n"})
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return p


# ---- record train -----------------------------------------------------------------------
def test_record_train_prompts_writes_a_full_trace(tmp_path, models, prompts, run_cli):
    target, draft = models
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                "-o", str(out), "--steps", "3", "--probe-positions", "6", "--max-new-tokens", "4")
    assert res.exit_code == 0, res.output
    assert "mean accept length" in res.output
    tr = open_trace(str(out))
    c = tr.contract
    L, H, Hd, Vd = c["num_layers"], c["hidden_size"], c["draft_hidden_size"], c["draft_vocab_size"]
    assert tr.side == "train" and tr.closed and c["engine"] == "specdiff-reference"
    assert c["spec_steps"] == 3 and c["spec_topk"] == 1 and c["dtype"] == "bfloat16"
    assert c["capture_level"] == "default" and c["logits_topk"] == 8
    assert len(c["aux_hf_indices"]) == 3 and c["aux_convention"] in ("sglang", "specforge", "speculators")
    assert c["hot_token_id_sha256"] and c["draft_weights_sha256"] and c["embed_source"] == "target"
    seqs = tr.sequences
    assert [s.rid for s in seqs][:2] == ["a", "b"] and seqs[0].prompt_len == 5
    assert len(seqs[0].tokens) == 12 + 4  # greedy extension
    n_pos = sum(len(s.tokens) for s in seqs)
    n_depth = sum(max(len(s.tokens) - 1 - k, 0) for s in seqs for k in range(3))
    for j in range(3):
        assert tr.info(f"target.aux.{j}").shape == (H,) and tr.rows(f"target.aux.{j}") == n_pos
    assert tr.info("target.aux_cat").shape == (3 * H,) and tr.info("target.aux_cat").dtype == "bfloat16"
    assert tr.rows("target.argmax") == n_pos and tr.rows("draft.fc_out") == n_pos
    for name, shape in (("tokens", ()), ("draft.hidden_in", (Hd,)), ("draft.positions", ()), ("draft.attn_in", (2 * Hd,)),
                        ("draft.hidden_out", (Hd,)), ("draft.logits_topk.values", (8,)),
                        ("draft.logits_topk.ids", (8,)), ("draft.logsumexp", ()), ("draft.topk", (1,)),
                        ("draft.topk_target", (1,)), ("draft.accept", ()), ("draft.accept_cum", ())):
        assert tr.info(name).shape == shape, name
        assert tr.rows(name) == n_depth, name
    # tokens at (t, k) = x_{t+1+k}
    k = tr.keys("tokens")
    toks = tr.read("tokens")
    for r in range(0, len(toks), 7):
        s = tr.sequence(int(k["seq"][r]))
        assert toks[r] == s.tokens[k["pos"][r] + 1 + k["depth"][r]]
    # the draft's rope position at (t, k) is t + k (SpecForge / speculators TTT, SGLang drafting)
    pk = tr.keys("draft.positions")
    assert (tr.read("draft.positions") == pk["pos"] + pk["depth"]).all()
    # probes: every HF index 0..L at the first 6 positions; slots equal their probes
    probes = sorted(n for n in tr.names if n.startswith("target.probe."))
    assert probes == sorted(f"target.probe.{i}" for i in range(L + 1))
    assert tr.rows("target.probe.0") == sum(min(6, len(s.tokens)) for s in seqs)
    pk = tr.keys("target.probe.0")
    assert pk["pos"].max() == 5
    for j, i in enumerate(c["aux_hf_indices"]):
        ak = tr.keys(f"target.aux.{j}")
        sel = np.nonzero(ak["pos"] < 6)[0]
        a = tr.read(f"target.aux.{j}", as_float32=True)[sel]
        p = tr.read(f"target.probe.{i}", as_float32=True)
        order_a = np.lexsort((ak["pos"][sel], ak["seq"][sel]))
        order_p = np.lexsort((pk["pos"], pk["seq"]))
        np.testing.assert_array_equal(a[order_a], p[order_p])
    # d2t rows: one per draft id, seq -1
    dk = tr.keys("draft.d2t")
    assert tr.rows("draft.d2t") == Vd and (dk["seq"] == -1).all()
    np.testing.assert_array_equal(dk["pos"], np.arange(Vd))
    d2t = tr.read("draft.d2t")
    from specdiff.tracer.contract import sha256_array
    assert sha256_array(d2t.astype(np.int64) + np.arange(Vd, dtype=np.int64)) == c["hot_token_id_sha256"]
    # topk_target = topk + d2t[topk]; accept / accept_cum consistent
    tk, tkt = tr.read("draft.topk")[:, 0], tr.read("draft.topk_target")[:, 0]
    np.testing.assert_array_equal(tkt, tk + d2t[tk])
    acc, cum = tr.read("draft.accept"), tr.read("draft.accept_cum")
    assert acc.dtype == bool and not (cum & ~acc).any()
    rates = c["accept_rate"]
    assert len(rates) == 3 and all(0.0 <= r <= 1.0 for r in rates)
    assert all(0.0 <= r <= 1.0 for r in c["accept_cum_rate"])
    # logsumexp >= top value
    vals = tr.read("draft.logits_topk.values", as_float32=True)
    assert (tr.read("draft.logsumexp") + 1e-2 >= vals[:, 0]).all()


def test_record_train_replays_a_serving_trace_and_full_capture(tmp_path, models, run_cli):
    target, draft = models
    serve = tmp_path / "serve.trace"
    w = TraceWriter(str(serve), side="serve", contract={"engine": "sglang", "spec_steps": 2, "spec_topk": 2,
                                                       "aux_hf_indices": [1, 2, 3]})
    w.add_sequence([0, 40, 41, 42, 43, 44, 45, 46, 47], prompt_len=4, rid="req-7", seq_id=3)
    w.add_sequence([0, 50, 51, 52, 53, 54], prompt_len=2, rid="req-8", seq_id=5)
    w.close()
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(target), "--draft", str(draft), "--replay", str(serve),
                "-o", str(out), "--capture", "full", "--dtype", "float32", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    tr = open_trace(str(out))
    c = tr.contract
    assert [(s.id, s.rid, s.prompt_len) for s in tr.sequences] == [(3, "req-7", 4), (5, "req-8", 2)]
    assert c["spec_steps"] == 2 and c["spec_topk"] == 2 and c["dtype"] == "float32"
    assert c["served_aux_hf_indices"] == [1, 2, 3] and c["aux_hf_indices"] != [1, 2, 3]  # training layers
    assert tr.info("draft.logits").shape == (c["draft_vocab_size"],) and tr.info("draft.topk").shape == (2,)
    assert tr.info("draft.fc_out").dtype == "float32" and tr.info("target.aux.0").dtype == "bfloat16"
    assert not any(n.startswith("target.probe") for n in tr.names)
    assert set(tr.keys("draft.fc_out")["seq"]) == {3, 5}
    # the trace exists: a second run without --overwrite is one clear error
    res = run_cli("record", "train", "--target", str(target), "--draft", str(draft), "--replay", str(serve),
                "-o", str(out))
    assert res.exit_code == 2 and "already exists" in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.mark.skipif(not (DEMO / "draft2l" / "config.json").is_file(), reason="the two-layer demo draft is not built")
def test_record_train_runs_the_two_layer_demo_draft(tmp_path, prompts, run_cli):
    """traces/models/draft2l (num_hidden_layers 2) on the demo target: recorded, its
    config fact says 2 layers, and it drafts well (mean accept length well above 1)."""
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(DEMO / "target"), "--draft", str(DEMO / "draft2l"),
                  "--prompts", str(prompts), "-o", str(out), "--steps", "3", "--max-new-tokens", "16")
    assert res.exit_code == 0, res.output
    tr = open_trace(str(out))
    assert tr.contract["draft_config"]["num_hidden_layers"] == 2
    acc = tr.read("draft.accept_cum").reshape(-1)
    assert acc.mean() > 0.4, acc.mean()  # the rows accepted at every depth <= k


def test_record_train_writes_absolute_paths_given_relative_ones(tmp_path, models, run_cli, monkeypatch):
    """A trace read from another working directory names the same models."""
    target, draft = models
    serve = tmp_path / "serve.trace"
    w = TraceWriter(str(serve), side="serve", contract={"engine": "sglang", "spec_steps": 1, "spec_topk": 1})
    w.add_sequence([0, 40, 41, 42, 43, 44], prompt_len=3, rid="req-1", seq_id=0)
    w.close()
    monkeypatch.chdir(target.parent)
    monkeypatch.delenv("SPECDIFF_RECORD_RELATIVE_TO", raising=False)
    rel_serve = os.path.relpath(serve, target.parent)
    res = run_cli("record", "train", "--target", target.name, "--draft", draft.name, "--replay", rel_serve,
                  "-o", str(tmp_path / "train.trace"), "--dtype", "float32", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    c = open_trace(str(tmp_path / "train.trace")).contract
    assert (c["model_name"], c["draft_name"], c["replay_of"]) == (str(target), str(draft), str(serve))


def test_record_train_records_the_target_identity_it_loaded(tmp_path, models, prompts, run_cli):
    """The identity facts the SGLang recorder reads from its live target, computed here from the target
    record train loaded; checked against the checkpoint files read independently."""
    from transformers import AutoConfig

    from specdiff.tracer.contract import config_sha256, weights_fingerprint

    target, draft = models
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                  "-o", str(out), "--steps", "1", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    c = open_trace(str(out)).contract
    raw = json.loads((target / "config.json").read_text())
    weights = {}
    for f in sorted(target.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    embed = weights["model.embed_tokens.weight"]
    assert c["target_architecture"] == raw["architectures"][0] == "LlamaForCausalLM"
    assert c["target_config_sha256"] == config_sha256(AutoConfig.from_pretrained(str(target), local_files_only=True))
    assert c["target_weights_fingerprint"] == weights_fingerprint(embed, raw["vocab_size"])
    assert (c["target_num_experts"], c["target_experts_per_token"]) == (None, None)  # dense
    assert c["aux_prenorm_indices"] == []  # Llama: no aux slot is the pre-norm output


def test_explicit_aux_layers_and_bad_counts(tmp_path, models, prompts, run_cli):
    target, draft = models
    out = tmp_path / "t.trace"
    res = run_cli("record", "train", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                "-o", str(out), "--aux-layers", "0,3,5", "--aux-convention", "hf", "--probe-positions", "0",
                "--steps", "1")
    assert res.exit_code == 0, res.output
    assert open_trace(str(out)).contract["aux_hf_indices"] == [0, 3, 5]
    res = run_cli("record", "train", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
                "-o", str(tmp_path / "u.trace"), "--aux-layers", "1,2", "--aux-convention", "specforge")
    assert res.exit_code == 2 and "expects 3 slots" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_draft_with_missing_keys_is_refused(tmp_path, models, prompts, run_cli):
    target, draft = models
    bad = tmp_path / "bad"
    shutil.copytree(draft, bad)
    f = bad / "model.safetensors"
    sd = load_file(str(f))
    del sd["midlayer.mlp.up_proj.weight"]
    sd["extra.weight"] = torch.zeros(2)
    save_file(sd, str(f))
    res = run_cli("record", "train", "--target", str(target), "--draft", str(bad), "--prompts", str(prompts),
                "-o", str(tmp_path / "x.trace"))
    assert res.exit_code == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdiff: error:")
    assert "midlayer.mlp.up_proj.weight" in lines[0] and "extra.weight" in lines[0]
    assert not (tmp_path / "x.trace").exists()


# ---- training hooks ---------------------------------------------------------------------
_BORROWED = ("fc_input", "_qkv", "_attend", "_layer", "decoder_layers", "ttt_forward", "hot_token_id", "logits")


class LlamaForCausalLMEagle3(Eagle3Draft):
    """SpecForge's draft module names: embed_tokens, fc, midlayer.*, norm, lm_head, d2t/t2d."""


class OnlineEagle3Model(nn.Module):
    """SpecForge's training wrapper: the draft sits under ``draft_model``."""

    def __init__(self, draft):
        super().__init__()
        self.draft_model = draft

    def forward(self, aux, ids, steps, lengths):
        return self.draft_model.ttt_forward(aux, ids, steps, lengths=lengths)


class Eagle3DraftModel(nn.Module):
    """speculators' module names: embed_tokens, fc, layers.0.*, norm, lm_head (same math)."""

    def __init__(self, ref: Eagle3Draft):
        super().__init__()
        self.config = ref.config
        self.embed_tokens, self.fc, self.norm, self.lm_head = ref.embed_tokens, ref.fc, ref.norm, ref.lm_head
        self.layers = nn.ModuleList([ref.midlayer])
        self.input_norm, self.fc_norm = ref.input_norm, ref.fc_norm
        self.register_buffer("d2t", ref.d2t.clone())

    @property
    def midlayer(self):
        return self.layers[0]

    def forward(self, aux, ids, steps, lengths):
        return self.ttt_forward(aux, ids, steps, lengths=lengths)


for _n in _BORROWED:
    setattr(Eagle3DraftModel, _n, getattr(Eagle3Draft, _n))


class RenamedDraft(Eagle3DraftModel):
    """Arbitrary names, reached through a name map."""

    def __init__(self, ref):
        super().__init__(ref)
        self.proj = self.fc
        del self.fc

    @property
    def fc(self):
        return self.proj


def _batch(cfg, seed=1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([9, 6])
    aux = torch.randn(2, 9, cfg.aux_width, generator=g)
    ids = torch.randint(0, cfg.vocab_size, (2, 9), generator=g)
    return aux, ids, lengths


def _sorted_rows(tr, name):
    k = tr.keys(name)
    order = np.lexsort((k["pos"], k["depth"], k["seq"]))
    return ({c: k[c][order] for c in ("seq", "pos", "depth")},
            tr.read(name, as_float32=tr.info(name).dtype in ("bfloat16", "float16"))[order])


def _expected(ref, aux, ids, lengths, steps, seq_ids):
    """The rows ``record train`` builds from the reference forward (tracer.rows.ttt_rows)."""
    from specdiff.tracer.rows import RowBatch, RowLayout, ttt_rows
    out = ref.ttt_forward(aux, ids, steps, lengths=lengths)
    batch = RowBatch()
    ttt_rows(batch, RowLayout.padded(seq_ids, lengths, ids.shape[1]), out, level="full", topk=2,
             hot_token_id=ref.hot_token_id())
    res = {}
    for name, (values, seq, pos, depth, _it) in batch.collected().items():
        order = np.lexsort((pos, depth, seq))
        res[name] = ({"seq": seq[order], "pos": pos[order], "depth": depth[order]}, values.numpy()[order])
    return res


@pytest.mark.parametrize("kind", ["reference", "reference-2-layers", "specforge", "speculators", "name_map"])
def test_hooks_record_the_reference_tensors(tmp_path, kind):
    # two layers: hidden_in / attn_in are layer 0's, hidden_out the last layer's (the final norm's input)
    layers = 2 if kind == "reference-2-layers" else 1
    kind = kind.removesuffix("-2-layers")
    ref = _random_draft(seed=4, norm_before_fc=kind == "reference", num_hidden_layers=layers)
    cfg = ref.config
    if kind == "reference":
        model, adapter, want = ref, "auto", "reference"
    elif kind == "specforge":
        sf = LlamaForCausalLMEagle3(cfg)
        sf.load_state_dict(ref.state_dict())
        model, adapter, want = OnlineEagle3Model(sf), "auto", "specforge"
    elif kind == "speculators":
        model, adapter, want = Eagle3DraftModel(ref), "auto", "speculators"
    else:
        model = RenamedDraft(ref)
        adapter = {"fc": "proj", "embed": "embed_tokens", "hidden_norm": "layers.0.hidden_norm",
                   "attn": "layers.0.self_attn.q_proj", "norm": "norm", "lm_head": "lm_head"}
        want = "name_map"
    aux, ids, lengths = _batch(cfg)
    steps, seq_ids = 3, [10, 11]
    w = TraceWriter(str(tmp_path / "h.trace"), side="train")
    rec = attach_recorder(model, w, adapter=adapter, topk=2, logits="full")
    assert rec.adapter == want
    rec.batch(seq_ids, lengths, tokens=ids)
    with torch.no_grad():
        model(aux, ids, steps, lengths=lengths)
    rec.detach()
    w.close()
    tr = open_trace(str(tmp_path / "h.trace"))
    exp = _expected(ref, aux, ids, lengths, steps, seq_ids)
    names = ["tokens", "draft.fc_in", "draft.fc_out", "draft.hidden_in", "draft.attn_in",
             "draft.hidden_out", "draft.logits", "draft.topk", "draft.topk_target"]
    if layers == 2:  # layer 0's output, read at layer 1's hidden_norm
        names.append("draft.layer_out.0")
    if kind == "reference":  # only the reference map names a rope module fed the positions
        names.append("draft.positions")
    else:
        assert "draft.positions" not in tr.names
    for name in names:
        keys, vals = _sorted_rows(tr, name)
        ekeys, evals = exp[name]
        for c in ("seq", "pos", "depth"):
            np.testing.assert_array_equal(keys[c], ekeys[c], err_msg=f"{name} {c}")
        np.testing.assert_array_equal(vals, evals, err_msg=name)
    keys, cat = _sorted_rows(tr, "target.aux_cat")
    b = np.asarray([0] * 9 + [1] * 6)
    t = np.r_[np.arange(9), np.arange(6)]
    np.testing.assert_array_equal(cat, aux[b, t].numpy())
    _, a1 = _sorted_rows(tr, "target.aux.1")
    np.testing.assert_array_equal(a1, aux[b, t][:, 32:64].numpy())
    assert tr.contract["spec_steps"] == 3 and tr.contract["hot_token_id_sha256"]
    assert [len(s.tokens) for s in tr.sequences] == [9, 6]


def _no_hooks(model):
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_detach_leaves_the_model_unchanged_and_accept_from_labels(tmp_path):
    ref = _random_draft(seed=5)
    model = Eagle3DraftModel(ref)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    aux, ids, lengths = _batch(ref.config, seed=2)
    with torch.no_grad():
        plain = model(aux, ids, 3, lengths=lengths)
    w = TraceWriter(str(tmp_path / "d.trace"), side="train")
    rec = attach_recorder(model, w)
    assert not _no_hooks(model)
    argmax = torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        pre = model(aux, ids, 3, lengths=lengths)  # recorded forward before any batch(): nothing written
    rec.batch([0, 1], lengths, tokens=ids, target_argmax=argmax)
    with torch.no_grad():
        hooked = model(aux, ids, 3, lengths=lengths)
    rec.detach()
    w.close()
    assert _no_hooks(model)
    after = model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    with torch.no_grad():
        again = model(aux, ids, 3, lengths=lengths)
    for out in (pre, hooked, again):
        for d in range(3):
            assert torch.equal(out.logits[d], plain.logits[d])
    tr = open_trace(str(tmp_path / "d.trace"))
    acc, cum = tr.read("draft.accept"), tr.read("draft.accept_cum")
    k = tr.keys("draft.accept")
    tkt = tr.read("draft.topk_target")[:, 0]
    kt = tr.keys("draft.topk_target")
    assert np.array_equal(k["pos"], kt["pos"])
    label = argmax.numpy()[k["seq"], k["pos"] + 1 + k["depth"]]
    np.testing.assert_array_equal(acc, tkt == label)
    assert not (cum & ~acc).any() and tr.rows("target.argmax") == 15


def test_hooks_refuse_a_model_without_the_modules(tmp_path):
    w = TraceWriter(str(tmp_path / "e.trace"), side="train")
    with pytest.raises(HookError, match="lm_head"):
        attach_recorder(nn.Sequential(nn.Linear(2, 2)), w)
    with pytest.raises(HookError, match="unknown"):
        attach_recorder(_random_draft(), w, adapter={"bogus": "x"})
    # a layer output role naming a module the model lacks: one line naming the role and the path
    with pytest.raises(HookError, match=r"modules not found for layer_out\.0 \(layers\.9\.hidden_norm\)") as e:
        attach_recorder(_random_draft(num_hidden_layers=2), w, adapter={"layer_out.0": "layers.9.hidden_norm"})
    assert "\n" not in str(e.value)
    w.close()
