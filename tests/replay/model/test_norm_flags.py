"""The draft's norm flags mean one thing everywhere (``specdiff.eagle3.norms``): the contract's
meaning strings, the reference forward, the config reader/writer and what SGLang 0.5.23 computes.

- No server: the flag table reads/writes both config layouts as SGLang and speculators do, and
  the reference fc input / fed-back hidden match SGLang's own ``LlamaModel.forward`` code
  (llama_eagle3.py:237-269, called on this CPU with SGLang's RMSNorm modules) for every flag.
- Real servers (``-m server``): a served draft with each flag flipped records that flag in the
  contract, and the fc input SGLang computed is the reference's ``fc_input`` of the recorded aux
  concat under that flag, and not under the other one.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdiff.eagle3.norms import NORM_FLAGS, NORMS_OFF, apply_fc_norms, read_norm_flags, write_norm_flags
from specdiff.replay.model.draft_config import Eagle3DraftConfig
from specdiff.replay.model.draft_model import Eagle3Draft, RMSNorm
from specdiff.tracer.contract_fields import CONTRACT_FIELDS


# ---- the flag table -------------------------------------------------------------------------
def test_the_contract_states_each_norm_flag_as_the_norms_module_does():
    for name, flag in NORM_FLAGS.items():
        assert CONTRACT_FIELDS[name] == ((bool,), flag.meaning)
    assert "whole aux concat" in NORM_FLAGS["norm_before_fc"].meaning
    assert "per aux slot" in NORM_FLAGS["fc_norm"].meaning


@pytest.mark.parametrize("raw,want", [
    ({}, {}),
    # SGLang reads eagle_config first, then the top level (llama_eagle3.py:173-175)
    ({"eagle_config": {"norm_before_fc": True}}, {"norm_before_fc": True}),
    ({"eagle_config": {"norm_before_fc": False}, "norm_before_fc": True}, {}),
    ({"norm_before_fc": True}, {"norm_before_fc": True}),
    # fc_norm OR the legacy use_aux_norm (llama_eagle3.py:185-187)
    ({"fc_norm": False, "use_aux_norm": True}, {"fc_norm": True}),
    ({"use_aux_norm": True}, {"fc_norm": True}),
    ({"norm_output": True, "norm_before_residual": True}, {"norm_output": True, "norm_before_residual": True}),
])
def test_a_specforge_config_turns_norms_on_as_sglang_reads_it(raw, want):
    got = {k: v for k, (v, _key) in read_norm_flags(raw, "specforge").items()}
    assert got == {**NORMS_OFF, **want}


def test_a_speculators_config_reads_only_top_level_flags():
    raw = {"eagle_config": {"norm_before_fc": True}, "fc_norm": True, "use_aux_norm": True}
    got = read_norm_flags(raw, "speculators")
    assert got["norm_before_fc"] == (False, None) and got["fc_norm"] == (True, "fc_norm")


@pytest.mark.parametrize("fmt", ["specforge", "speculators"])
@pytest.mark.parametrize("flag", sorted(NORM_FLAGS))
def test_each_flag_written_reads_back_from_the_key_that_was_written(fmt, flag):
    conf: dict = {}
    write_norm_flags(conf, fmt, {**NORMS_OFF, flag: True})
    got = read_norm_flags(conf, fmt)
    assert {k: v for k, (v, _) in got.items()} == {**NORMS_OFF, flag: True}
    assert got[flag][1] == flag  # written at the top level, where editing it takes effect


def test_a_specforge_config_never_says_norm_output_false():
    # SpecForge 0.2.0 reads an explicit false as "no final norm before lm_head" (llama3_eagle.py:1690)
    conf: dict = {}
    write_norm_flags(conf, "specforge", NORMS_OFF)
    assert conf == {"norm_before_fc": False, "fc_norm": False}


@pytest.mark.parametrize("flag", ["norm_before_fc", "fc_norm"])
def test_the_check_describes_a_norm_flag_as_the_contract_does(tmp_path, flag):
    from specdiff.replay.model.checkpoint import save_draft
    from specdiff.replay.preflight.files import read_draft
    from specdiff.replay.preflight.rules.norms import check_norms

    save_draft(_random_model(**{flag: True}), tmp_path, "specforge")
    found = [f for f in check_norms(read_draft(tmp_path), engines=("sglang",)) if f.kind == "norm.flags"]
    assert len(found) == 1 and f"{flag} set: {CONTRACT_FIELDS[flag][1]} (SGLang 0.5.23" in found[0].message


# ---- the reference forward against SGLang's own code ----------------------------------------
K, H, HD = 3, 16, 24  # aux slots, target hidden, draft hidden (K*H != HD: SGLang runs fc)


def _cfg(**flags) -> Eagle3DraftConfig:
    return Eagle3DraftConfig(hidden_size=HD, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2,
                             head_dim=6, vocab_size=50, draft_vocab_size=20, rms_norm_eps=1e-6, rope_theta=10000.0,
                             rope_scaling=None, num_aux=K, target_hidden_size=H, **{**NORMS_OFF, **flags})


def _random_model(**flags) -> Eagle3Draft:
    model = Eagle3Draft(_cfg(**flags))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if p.dim() == 1 else 0.1) + (1.0 if p.dim() == 1 else 0))
    return model.eval()


@pytest.fixture(scope="module")
def sglang_eagle3():
    pytest.importorskip("sglang")
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models import llama_eagle3

    return llama_eagle3, RMSNorm


def _sglang_forward(sglang_eagle3, model: Eagle3Draft, aux: torch.Tensor, *, norm_before_fc, fc_norm, norm_output,
                    norm_before_residual=False):
    """SGLang 0.5.23's ``LlamaModel.forward`` (llama_eagle3.py:209-269) on ``model``'s weights: the
    real method and RMSNorm modules; the decoder layer is an identity stand-in, so the result is
    (final-normed fc output, the hidden fed back). SGLang has no ``norm_before_residual``."""
    assert not norm_before_residual
    mod, SgRMSNorm = sglang_eagle3

    def sg_norm(weight):
        n = SgRMSNorm(weight.shape[0], eps=model.config.rms_norm_eps)
        with torch.no_grad():
            n.weight.copy_(weight)
        return n

    c = model.config
    ones_in = torch.ones(c.aux_width)
    ones_slot = torch.ones(c.target_hidden_size)
    this = SimpleNamespace(
        is_mrope_enabled=False, num_aux_hidden_states=c.num_aux, fc=model.fc, norm_output=norm_output,
        input_norm=sg_norm(model.input_norm.weight if model.input_norm is not None else ones_in)
        if norm_before_fc else None,
        fc_norm=[sg_norm(model.fc_norm[j].weight if model.fc_norm is not None else ones_slot) for j in range(c.num_aux)]
        if fc_norm else None,
        # identity decoder layer with a zero residual: SGLang's final norm then adds 0 and norms
        layers=[lambda positions, embeds, hidden_states, forward_batch, residual:
                (hidden_states, torch.zeros_like(hidden_states))],
        norm=sg_norm(model.norm.weight))
    batch = SimpleNamespace(spec_info=SimpleNamespace(hidden_states=aux))
    embeds = torch.zeros(aux.shape[0], c.hidden_size)
    with torch.no_grad():
        to_logits, (fed_back,) = mod.LlamaModel.forward(this, None, torch.arange(aux.shape[0]), batch,
                                                        input_embeds=embeds)
    return to_logits, fed_back


@pytest.mark.parametrize("flags", [{}, {"norm_before_fc": True}, {"fc_norm": True},
                                   {"norm_before_fc": True, "fc_norm": True}, {"norm_output": True}],
                         ids=["none", "norm_before_fc", "fc_norm", "both", "norm_output"])
def test_the_reference_fc_input_and_fed_back_hidden_are_what_sglang_computes(sglang_eagle3, flags):
    model = _random_model(**flags)
    aux = torch.randn(7, K * H, generator=torch.Generator().manual_seed(1)) * 2.0
    with torch.no_grad():
        fc_out = model.fc(model.fc_input(aux))
        normed = model.norm(fc_out)
        fed_ref = normed if model.config.norm_output else fc_out
    sg_logits_in, sg_fed = _sglang_forward(sglang_eagle3, model, aux, **{**NORMS_OFF, **flags})
    torch.testing.assert_close(sg_logits_in, normed, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sg_fed, fed_ref, rtol=1e-5, atol=1e-5)
    # the check can fail: SGLang with the norm flags swapped computes something else
    if flags.get("norm_before_fc") != flags.get("fc_norm"):
        swapped = {"norm_before_fc": bool(flags.get("fc_norm")), "fc_norm": bool(flags.get("norm_before_fc"))}
        other, _ = _sglang_forward(sglang_eagle3, model, aux, norm_output=False, **swapped)
        assert (other - normed).abs().max() > 1e-2


# ---- real servers ---------------------------------------------------------------------------
PROMPTS = ["def main():\n    return", "import os\nimport sys\n\nclass "]

#: one server per flag setting; together they flip every flag SGLang serves, each against another value
SERVED = {"nbf_out": {"norm_before_fc": True, "norm_output": True}, "fcn": {"fc_norm": True}}


@pytest.fixture(scope="module")
def norm_traces(tmp_path_factory, server_env):
    pytest.importorskip("sglang")
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    root = tmp_path_factory.mktemp("normflags")
    from specdiff.demo_models import bringup as mod

    target = root / "target"
    mod.build_target(target)
    env = server_env()
    out = {}
    for name, flags in SERVED.items():
        draft = root / f"draft-{name}"
        mod.build_draft(draft, **flags)
        trace = root / f"{name}.trace"
        spec = SpecSettings(num_steps=3, topk=1, num_draft_tokens=4)
        with ServerProcess(target, draft_model_path=draft, spec=spec, env={**env, "SPECDIFF_TRACE": str(trace)}) as srv:
            srv.generate(PROMPTS, max_new_tokens=8)
        out[name] = (draft, trace)
    return out


def _by_key(trace, name):
    keys = trace.keys(name, columns=("seq", "pos", "depth"))
    rows = trace.read(name, as_float32=True)
    return {(int(s), int(p)): rows[i] for i, (s, p, d) in enumerate(zip(keys["seq"], keys["pos"], keys["depth"]))
            if int(d) == 0}


@pytest.mark.server
@pytest.mark.parametrize("name", sorted(SERVED))
def test_a_served_draft_with_a_norm_flag_flipped_records_it_and_computes_it(norm_traces, name):
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.tracer.store import open_trace

    draft, path = norm_traces[name]
    trace = open_trace(str(path))
    flags = {**NORMS_OFF, **SERVED[name]}
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        assert trace.contract[flag] is flags[flag], flag
    # what SGLang fed to fc is the reference's fc input of the recorded aux concat under these flags
    aux, fc_in = _by_key(trace, "target.aux_cat"), _by_key(trace, "draft.fc_in")
    common = sorted(set(aux) & set(fc_in))
    assert len(common) >= 4
    x = torch.tensor(np.stack([aux[k] for k in common]))
    served = torch.tensor(np.stack([fc_in[k] for k in common]))
    model = load_draft(draft).model
    c = model.config
    with torch.no_grad():
        ref = model.fc_input(x).float()
        # the flags read the other way round (unit weights: the served norms' weights are random)
        swapped = apply_fc_norms(x, input_norm=RMSNorm(c.aux_width, c.rms_norm_eps) if c.fc_norm else None,
                                 fc_norm=[RMSNorm(c.target_hidden_size, c.rms_norm_eps)] * c.num_aux
                                 if c.norm_before_fc else None)
    torch.testing.assert_close(served, ref, rtol=3e-2, atol=3e-2)  # bf16 serving vs fp32 reference
    assert (served - swapped).abs().max() > 0.1  # the other flag's norm would show
