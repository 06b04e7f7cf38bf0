"""Multi-layer EAGLE-3 drafts (``num_hidden_layers`` N > 1) in the reference forward, the loader and check.

The independent computation below follows SGLang 0.5.23 ``srt/models/llama_eagle3.py`` literally,
in float64: it carries SGLang's ``(hidden_states, residual)`` pair through the layers with the fused
``RMSNorm(x, residual)`` (returns ``(norm(x + residual), x + residual)``): layer 0 (:97-102)
``residual = h``, attention over ``cat(input_layernorm(embed), hidden_norm(h))``; every layer
``post_attention_layernorm(attn, residual)`` then the MLP (:114-117), returning ``(mlp_out,
residual)`` unsummed; a later layer starts with ``hidden_norm(mlp_out, residual)`` (:103-105);
the final ``norm(hidden, residual)`` (:263-265) gives the logits input and the pre-norm hidden fed
back (:268). Attention is one explicit visibility mask over every layer's keys of all depths
(depth-0 rows s <= t, the row's own keys at depths 1..k), rope as complex rotations.
"""

from __future__ import annotations

import math

import pytest
import torch
from builders import random_specforge_draft
from safetensors.torch import load_file, save_file

from specdiff.eagle3.norms import NORMS_OFF
from specdiff.replay.model.checkpoint import CheckpointError, load_draft, save_draft
from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig


def _cfg(**kw) -> Eagle3DraftConfig:
    base = dict(hidden_size=32, intermediate_size=40, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                vocab_size=40, draft_vocab_size=16, target_hidden_size=24, num_aux=3, rms_norm_eps=1e-5,
                rope_theta=10000.0, rope_scaling=None, **NORMS_OFF)
    return Eagle3DraftConfig(**{**base, **kw})


def _random(cfg: Eagle3DraftConfig, seed: int = 0) -> Eagle3Draft:
    model = Eagle3Draft(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3 + (1.0 if p.ndim == 1 else 0.0))
    return model


def _rms(x, w, eps, residual=None):
    """SGLang RMSNorm: without ``residual`` the normed x; with it ``(norm(x + residual), x + residual)``."""
    if residual is not None:
        x = x + residual
    y = w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
    return y if residual is None else (y, x)


def _rope(x, pos, theta):
    """x [T, heads, d] rotated at positions pos [T] (neox halves) as complex multiplication."""
    d = x.shape[-1]
    ang = pos[:, None, None].double() * theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    z = torch.complex(x[..., : d // 2], x[..., d // 2:]) * torch.polar(torch.ones_like(ang), ang)
    return torch.cat([z.real, z.imag], dim=-1)


def sglang_rule(model: Eagle3Draft, aux_cat, input_ids, steps):
    """One sequence (aux_cat [T, K*H], input_ids [T]) -> per depth (pre-norm hidden [T,Hd], logits [T,Vd],
    [the outputs [T,Hd] of layers 0..N-2: the sums a later layer's fused hidden_norm forms])."""
    c, sd = model.config, {k: v.double() for k, v in model.state_dict().items()}
    eps, nh, nkv, hd = c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    T = input_ids.shape[0]
    names = ["midlayer"] + [f"layers.{i}" for i in range(1, c.num_hidden_layers)]
    keys = {n: [] for n in names}  # layer -> per depth [T, nkv, hd]
    vals = {n: [] for n in names}
    h = aux_cat.double() @ sd["fc.weight"].T
    out = []
    for d in range(steps):
        tok = torch.zeros(T, dtype=torch.int64)
        tok[: max(T - 1 - d, 0)] = input_ids[1 + d:]
        pos = torch.arange(T) + d
        hidden, residual, earlier = h, None, []
        for i, n in enumerate(names):
            def w(k, n=n):
                return sd[f"{n}.{k}.weight"]
            if i == 0:
                residual = hidden
                x = torch.cat([_rms(sd["embed_tokens.weight"][tok], w("input_layernorm"), eps),
                               _rms(hidden, w("hidden_norm"), eps)], dim=-1)
            else:
                x, residual = _rms(hidden, w("hidden_norm"), eps, residual)
                earlier.append(residual)
            q = _rope((x @ w("self_attn.q_proj").T).view(T, nh, hd), pos, c.rope_theta)
            keys[n].append(_rope((x @ w("self_attn.k_proj").T).view(T, nkv, hd), pos, c.rope_theta))
            vals[n].append((x @ w("self_attn.v_proj").T).view(T, nkv, hd))
            K, V = torch.cat(keys[n]), torch.cat(vals[n])  # [(d+1)*T, nkv, hd], depth-major
            depth, row = torch.arange(d + 1).repeat_interleave(T), torch.arange(T).repeat(d + 1)
            t = torch.arange(T)[:, None]
            visible = ((depth == 0) & (row <= t)) | ((depth > 0) & (row == t))  # [T, (d+1)*T]
            grp = torch.arange(nh) // (nh // nkv)
            s = torch.einsum("thd,shd->hts", q, K[:, grp]) / math.sqrt(hd)
            p = s.masked_fill(~visible, float("-inf")).softmax(-1)
            a = torch.einsum("hts,shd->thd", p, V[:, grp]).reshape(T, nh * hd) @ w("self_attn.o_proj").T
            z, residual = _rms(a, w("post_attention_layernorm"), eps, residual)
            g = z @ w("mlp.gate_proj").T
            hidden = (g * torch.sigmoid(g) * (z @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
        normed, pre = _rms(hidden, sd["norm.weight"], eps, residual)
        out.append((pre, normed @ sd["lm_head.weight"].T, earlier))
        h = pre
    return out


@pytest.mark.parametrize("layers", [2, 3])
def test_n_layer_forward_matches_sglangs_fused_residual_chain(layers):
    model = _random(_cfg(num_hidden_layers=layers))
    g = torch.Generator().manual_seed(1)
    aux, ids = torch.randn(2, 7, 72, generator=g), torch.randint(0, 40, (2, 7), generator=g)
    got = model.ttt_forward(aux, ids, steps=3)
    tol = dict(rtol=1e-4, atol=1e-4)  # the reference normalises and rotates in fp32 (HF LlamaRMSNorm)
    for b in range(2):
        for d, (hidden, logits, earlier) in enumerate(sglang_rule(model, aux[b], ids[b], steps=3)):
            torch.testing.assert_close(got.hidden_out[d][b].double(), hidden, **tol)
            torch.testing.assert_close(got.logits[d][b].double(), logits, **tol)
            assert len(got.layer_out[d]) == len(earlier) == layers - 1  # draft.layer_out.{i}
            for mine, theirs in zip(got.layer_out[d], earlier, strict=True):
                torch.testing.assert_close(mine[b].double(), theirs, **tol)
    # the later layers matter: without them the logits move far outside that tolerance
    one = Eagle3Draft(_cfg())
    one.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("layers.")})
    assert (one.ttt_forward(aux, ids, steps=1).logits[0] - got.logits[0]).abs().max() > 0.1


def test_a_two_layer_draft_saves_and_loads_in_both_formats(tmp_path):
    model = _random(_cfg(num_hidden_layers=2, eagle_aux_hidden_state_layer_ids=[-1, 2, 5]))
    aux, ids = torch.randn(1, 6, 72), torch.randint(0, 40, (1, 6))
    want = model.ttt_forward(aux, ids, steps=2).logits
    for fmt in ("specforge", "speculators"):
        save_draft(model, tmp_path / fmt, fmt, target_num_layers=8, include_embed=True)
        keys = load_file(str(tmp_path / fmt / "model.safetensors"))
        assert "layers.1.self_attn.q_proj.weight" in keys and keys["layers.1.self_attn.q_proj.weight"].shape[1] == 32
        loaded = load_draft(tmp_path / fmt)
        assert loaded.config.num_hidden_layers == 2
        for a, b in zip(loaded.model.ttt_forward(aux, ids, steps=2).logits, want):
            torch.testing.assert_close(a, b)


def _drop(path, *names):
    f = path / "model.safetensors"
    sd = load_file(str(f))
    for n in names:
        sd.pop(n)
    save_file(sd, str(f))


def test_a_missing_layer_1_weight_is_one_line_naming_the_key(tmp_path):
    save_draft(_random(_cfg(num_hidden_layers=2)), tmp_path, "specforge")
    _drop(tmp_path, "layers.1.mlp.up_proj.weight")
    with pytest.raises(CheckpointError) as e:
        load_draft(tmp_path)
    msg = str(e.value)
    assert "\n" not in msg and "missing keys: layers.1.mlp.up_proj.weight" in msg


def test_a_speculators_format_later_layer_is_read_by_its_input_layernorm(tmp_path):
    """speculators 0.9.0 trains layer 1 as a plain decoder layer (input norm ``input_layernorm``,
    models/eagle3/core.py:81-94), as vLLM 0.32.0 reads it (llama_eagle3.py:136-138): a file with no
    ``layers.1.hidden_norm`` loads with that tensor as layer 1's input norm, says so, and computes what the
    model that wrote it computes."""
    model = _random(_cfg(num_hidden_layers=2))
    with torch.no_grad():
        model.layers["1"].hidden_norm.weight.uniform_(0.5, 1.5)  # a trained norm, not RMSNorm's ones
    save_draft(model, tmp_path, "speculators")
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    assert torch.equal(sd["layers.1.input_layernorm.weight"], sd["layers.1.hidden_norm.weight"])  # both names
    del sd["layers.1.hidden_norm.weight"]
    save_file(sd, str(f))
    loaded = load_draft(tmp_path)
    assert any(n.startswith("layers.1.input_layernorm.weight read as layer 1's input norm") for n in loaded.notes)
    aux, ids = torch.randn(1, 5, 72), torch.randint(0, 40, (1, 5))
    torch.testing.assert_close(loaded.model.ttt_forward(aux, ids, 2).logits[1], model.ttt_forward(aux, ids, 2).logits[1])


def test_a_later_input_layernorm_is_written_as_its_hidden_norm_and_ignored_on_load(tmp_path):
    """SGLang's later layers own an input_layernorm their forward never calls and vLLM reads: the specforge
    export writes the layer's hidden_norm there too, so one file serves both engines; where the two differ
    load_draft reads hidden_norm (SGLang's rule) and notes the other, which changes nothing."""
    model = _random(_cfg(num_hidden_layers=2))
    with torch.no_grad():
        model.layers["1"].hidden_norm.weight.uniform_(0.5, 1.5)
    save_draft(model, tmp_path, "specforge", include_embed=True)
    f = tmp_path / "model.safetensors"
    sd = load_file(str(f))
    assert torch.equal(sd["layers.1.input_layernorm.weight"], model.layers["1"].hidden_norm.weight)
    save_file({**sd, "layers.1.input_layernorm.weight": torch.full((32,), 7.0)}, str(f))
    loaded = load_draft(tmp_path)
    assert "ignored layers.1.input_layernorm.weight" in loaded.notes
    aux, ids = torch.randn(1, 5, 72), torch.randint(0, 40, (1, 5))
    torch.testing.assert_close(loaded.model.ttt_forward(aux, ids, 2).logits[1], model.ttt_forward(aux, ids, 2).logits[1])


# ---- specdiff check --------------------------------------------------------------------------
@pytest.fixture
def pair(tmp_path):
    from transformers import LlamaConfig
    LlamaConfig(num_hidden_layers=8, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=512, rope_theta=10000.0,
                eos_token_id=1, bos_token_id=0).save_pretrained(tmp_path / "target")
    random_specforge_draft(tmp_path / "draft", aux_ids=[-1, 3, 6], num_layers=2)
    return tmp_path / "target", tmp_path / "draft"


def test_check_passes_a_two_layer_draft(pair, run_cli):
    target, draft = pair
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", "0,4,7")
    assert r.exit_code == 0, r.output
    assert "0 error(s)" in r.output


def test_check_names_a_missing_layer_1_weight(pair, run_cli):
    target, draft = pair
    _drop(draft, "layers.1.self_attn.k_proj.weight")
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", "0,4,7")
    assert r.exit_code != 0
    assert "layers.1.self_attn.k_proj.weight [32, 64] is missing" in r.output


def test_check_says_a_second_layer_beyond_num_hidden_layers_is_skipped(tmp_path, run_cli):
    """A two-layer checkpoint whose config says 1: SGLang builds one layer and drops layers.1.* silently."""
    from transformers import LlamaConfig
    LlamaConfig(num_hidden_layers=8, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256, max_position_embeddings=512).save_pretrained(tmp_path / "t")
    random_specforge_draft(tmp_path / "d", aux_ids=[-1, 3, 6], num_layers=2)
    f = tmp_path / "d" / "config.json"
    f.write_text(f.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 1'))
    r = run_cli("check", "--target", tmp_path / "t", "--draft", tmp_path / "d", "--training-layers", "0,4,7")
    assert r.exit_code == 1, r.output
    assert "the checkpoint holds decoder layer(s) [1] but num_hidden_layers is 1" in r.output
    assert "set num_hidden_layers to 2" in r.output


def test_check_warns_for_vllm_where_a_later_layers_input_layernorm_is_not_its_hidden_norm(pair, run_cli):
    """vLLM 0.32.0 normalises layer 1's input with input_layernorm (llama_eagle3.py:136-138), SGLang with
    hidden_norm (:103-105): a file whose two differ is a vLLM warning with the copy as fix, not an SGLang one;
    the same file with hidden_norm written into input_layernorm too passes for both."""
    target, draft = pair
    f = draft / "model.safetensors"
    sd = load_file(str(f))
    sd["layers.1.hidden_norm.weight"] = sd["layers.1.hidden_norm.weight"] * 1.5  # a trained norm, not the ones
    save_file(sd, str(f))
    assert not torch.equal(sd["layers.1.hidden_norm.weight"], sd["layers.1.input_layernorm.weight"])
    args = ("check", "--target", target, "--draft", draft, "--training-layers", "0,4,7", "--engine")
    r = run_cli(*args, "vllm")
    assert "weights.later_input_norm" in r.output and "layers.1.input_layernorm.weight" in r.output, r.output
    assert "weights.later_input_norm" not in run_cli(*args, "sglang").output
    save_file({**sd, "layers.1.input_layernorm.weight": sd["layers.1.hidden_norm.weight"].clone()}, str(f))
    assert "weights.later_input_norm" not in run_cli(*args, "vllm").output


def test_check_names_a_speculators_format_later_layer_for_sglang_only(pair, run_cli):
    """The other way round: the trained norm in ``layers.1.input_layernorm`` only (speculators' format), which
    vLLM reads and SGLang never does (it keeps the hidden_norm it built): an SGLang error with the copy as fix,
    nothing for vLLM, and no 'missing key'."""
    target, draft = pair
    f = draft / "model.safetensors"
    sd = load_file(str(f))
    sd["layers.1.input_layernorm.weight"] = sd.pop("layers.1.hidden_norm.weight") * 1.5
    save_file(sd, str(f))
    args = ("check", "--target", target, "--draft", draft, "--training-layers", "0,4,7", "--engine")
    r = run_cli(*args, "sglang")
    assert r.exit_code == 1, r.output
    out = " ".join(r.output.split())  # the table wraps its evidence
    assert "weights.later_input_norm layer 1: SGLang normalises its input with layers.1.hidden_norm" in out, out
    assert "fix: write layers.1.input_layernorm.weight's values into layers.1.hidden_norm.weight" in out
    assert "is missing" not in r.output
    r = run_cli(*args, "vllm")
    assert "weights.later_input_norm" not in r.output and "is missing" not in r.output, r.output
