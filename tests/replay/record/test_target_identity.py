"""Target identity: ``record train`` records which target it ran, and
``specdiff diff`` refuses, first and in one line, a pair recorded on two different targets; the
same weights in another dtype are the same target. GPT-OSS's pre-norm aux slot (SGLang capture
index L, srt/models/gpt_oss.py:726-738) is replayed from the last layer's output before the final
norm, not refused and not HF hidden_states[L].

Real parts: tiny targets built offline (``specdiff.demo_models.families``: 8 layers, hidden 256,
the demo's 4096-token vocab, seeded random weights), the bring-up EAGLE-3 draft, ``specdiff record
train`` and ``specdiff diff`` through the CLI, real zarr trace stores.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from specdiff.tracer.store import TraceWriter, open_trace  # noqa: E402

torch.set_num_threads(2)
IDENTITY = ("target_architecture", "target_config_sha256", "target_weights_fingerprint", "target_num_experts",
            "target_experts_per_token")
#: two sequences of demo-tokenizer ids (BOS 0), long enough for 3 draft depths
SEQS = [[0, 17, 33, 51, 90, 12, 7, 300, 41, 42, 43, 44, 45, 46], [0, 5, 6, 7, 8, 9, 10, 11, 12, 13]]


def _prompts(path: Path) -> Path:
    path.write_text("".join(json.dumps({"input_ids": s, "prompt_len": 5, "rid": f"r{i}"}) + "\n"
                            for i, s in enumerate(SEQS)))
    return path


@pytest.fixture(scope="module")
def llama_targets(tmp_path_factory):
    """{name: target dir}: ``a`` and ``b`` (Llama family, seeds 7 and 8, bf16 checkpoints: same
    config and tokenizer, different weights), ``a32`` (seed 7's fp32 weights saved in fp32, not
    bf16-rounded), the bring-up draft and a prompts file."""
    from specdiff.demo_models.bringup import build_draft
    from specdiff.demo_models.families import init_family_model, save_family_target, write_tokenizer

    root = tmp_path_factory.mktemp("identity")
    out = {}
    for name, seed in (("a", 7), ("b", 8)):
        model = init_family_model("llama", seed=seed)
        if name == "a":
            model.save_pretrained(str(root / "a32"))  # fp32 as initialised
            write_tokenizer(root / "a32")
            out["a32"] = root / "a32"
        out[name] = save_family_target(copy.deepcopy(model), "llama", root / name)  # bf16
    build_draft(root / "draft")
    out["draft"] = root / "draft"
    out["prompts"] = _prompts(root / "p.jsonl")
    return out


def _record(run_cli, target, draft, out, *extra) -> dict:
    r = run_cli("record", "train", "--target", target, "--draft", draft, "-o", out, "--steps", "2",
                "--probe-positions", "0", *extra)
    assert r.exit_code == 0, r.output
    return open_trace(str(out)).contract


def test_traces_of_two_different_targets_are_refused_first_in_one_line(tmp_path, llama_targets, run_cli):
    m = llama_targets
    ca = _record(run_cli, m["a"], m["draft"], tmp_path / "a.trace", "--prompts", m["prompts"])
    cb = _record(run_cli, m["b"], m["draft"], tmp_path / "b.trace", "--prompts", m["prompts"])
    # same architecture and config (only the seed differs), different weights
    assert ca["target_architecture"] == cb["target_architecture"] == "LlamaForCausalLM"
    assert ca["target_config_sha256"] == cb["target_config_sha256"]
    assert ca["target_weights_fingerprint"] != cb["target_weights_fingerprint"]
    # the rows really differ: without the refusal this pair would report a divergence at the target
    a, b = open_trace(str(tmp_path / "a.trace")), open_trace(str(tmp_path / "b.trace"))
    assert not np.allclose(a.read("target.aux.1").astype(np.float32), b.read("target.aux.1").astype(np.float32),
                           rtol=0.1, atol=0.1)
    for fmt in ("text", "json"):
        r = run_cli("diff", tmp_path / "a.trace", tmp_path / "b.trace", "--format", fmt)
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1, r.output
        fa, fb = ca["target_weights_fingerprint"][:12], cb["target_weights_fingerprint"][:12]
        assert lines[0] == (f"specdiff: error: traces of different targets: target_weights_fingerprint {fa} (A) vs "
                            f"{fb} (B); nothing is compared (record both sides on the same target model)")
        assert "first divergence" not in r.output and "config_sha256" not in r.output


def test_the_same_weights_in_fp32_and_bf16_are_the_same_target(tmp_path, llama_targets, run_cli):
    m = llama_targets
    c16 = _record(run_cli, m["a"], m["draft"], tmp_path / "a16.trace", "--prompts", m["prompts"])
    # the fp32 checkpoint run in fp32: neither the file's dtype nor the run dtype names another target
    c32 = _record(run_cli, m["a32"], m["draft"], tmp_path / "a32.trace", "--prompts", m["prompts"],
                  "--target-dtype", "float32")
    assert json.loads((m["a32"] / "config.json").read_text())["dtype"] == "float32"
    for f in IDENTITY:
        assert c16[f] == c32[f], f
    r = run_cli("diff", tmp_path / "a16.trace", tmp_path / "a32.trace", "--format", "json")
    assert r.exit_code in (0, 1), r.output
    assert "different targets" not in r.output
    assert json.loads(r.stdout)["tensors"], "the pair was compared"


def test_a_float16_copy_of_the_same_weights_is_not_refused(tmp_path, run_cli):
    """weights_fingerprint rounds to bf16 itself, so bf16 and fp32 copies agree; a float16 copy rounds small
    weights (float16 subnormals) again and can change it. The family's default-seed Llama target is one such
    checkpoint: the pair is compared, and the report says why the fingerprint was not."""
    from safetensors.torch import load_file

    from specdiff.demo_models.bringup import build_draft
    from specdiff.demo_models.families import build_family_target
    from specdiff.tracer.contract import weights_fingerprint

    target = build_family_target("llama", tmp_path / "target", trained=False)
    embed = load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"]
    assert weights_fingerprint(embed, 4096) != weights_fingerprint(embed.to(torch.float16), 4096)  # the premise
    build_draft(tmp_path / "draft")
    prompts = _prompts(tmp_path / "p.jsonl")
    c16 = _record(run_cli, target, tmp_path / "draft", tmp_path / "bf16.trace", "--prompts", prompts)
    cf = _record(run_cli, target, tmp_path / "draft", tmp_path / "fp16.trace", "--prompts", prompts,
                 "--target-dtype", "float16")
    assert c16["target_weights_fingerprint"] != cf["target_weights_fingerprint"]
    assert c16["target_config_sha256"] == cf["target_config_sha256"]
    r = run_cli("diff", tmp_path / "bf16.trace", tmp_path / "fp16.trace", "--format", "json")
    assert r.exit_code in (0, 1), r.output
    notes = [m["message"] for m in json.loads(r.stdout)["contract_mismatches"]
             if m["field"] == "target_weights_fingerprint"]
    assert notes == ["target weight fingerprints differ, but A ran the target in bfloat16 and B in float16: a cast "
                     "rounds small weights differently, so the fingerprint cannot tell a cast from other weights; "
                     "not compared"]


def test_a_fingerprint_difference_in_the_same_dtype_is_still_refused(tmp_path, run_cli):
    train = _synthetic(tmp_path / "t.trace", "train", {**BASE, "target_dtype": "float16"})
    serve = _synthetic(tmp_path / "s.trace", "serve", {**BASE, "dtype": "float16",
                                                       "target_weights_fingerprint": OTHER["target_weights_fingerprint"]})
    r = run_cli("diff", train, serve)
    assert r.exit_code == 2 and "target_weights_fingerprint ffffffffffff (training) vs eeeeeeeeeeee" in r.output


def _synthetic(path, side, contract, diverge=False):
    """A real store holding one sequence and rows of ``target.aux.0`` (diverging when asked)."""
    rng = np.random.default_rng(0)
    data = rng.standard_normal((8, 16)).astype(np.float32)
    with TraceWriter(str(path), side=side, contract=contract) as tw:
        tw.add_sequence(np.arange(1, 13, dtype=np.int32), prompt_len=4, rid="r0")
        tw.append("target.aux.0", -data + 3.0 if diverge else data, seq=0, pos=np.arange(8))
    return str(path)


BASE = {"engine": "test", "num_layers": 8, "hidden_size": 16, "vocab_size": 64, "aux_hf_indices": [2, 4, 5],
        "target_architecture": "Qwen3MoeForCausalLM", "target_config_sha256": "c" * 64,
        "target_weights_fingerprint": "f" * 64, "target_num_experts": 4, "target_experts_per_token": 2}
OTHER = {"target_architecture": "DeepseekV3ForCausalLM", "target_config_sha256": "d" * 64,
         "target_weights_fingerprint": "e" * 64, "target_num_experts": 8, "target_experts_per_token": None}


@pytest.mark.parametrize("field", IDENTITY)
def test_each_identity_fact_that_differs_is_named_with_both_values(tmp_path, field, run_cli):
    # other weights are another model; with other weights, every identity fact that differs is named
    weights = {"target_weights_fingerprint": OTHER["target_weights_fingerprint"]}
    train = _synthetic(tmp_path / "t.trace", "train", BASE)
    serve = _synthetic(tmp_path / "s.trace", "serve", {**BASE, field: OTHER[field], **weights}, diverge=True)
    r = run_cli("diff", train, serve, "--format", "text")
    assert r.exit_code == 2, r.output
    said = [f"{f} {_said(BASE[f])} (training) vs {_said(OTHER[f])} (serving)" for f in IDENTITY
            if f in (field, "target_weights_fingerprint")]
    assert r.output.strip() == (f"specdiff: error: traces of different targets: {'; '.join(said)}; nothing is "
                                "compared (record both sides on the same target model)")


def _said(v):
    return v[:12] if isinstance(v, str) and len(v) == 64 else v


@pytest.mark.parametrize("field", [f for f in IDENTITY if f != "target_weights_fingerprint"])
def test_the_same_weights_with_another_config_are_one_target_and_a_contract_difference(tmp_path, field, run_cli):
    # identity by weights: a rope override at serving (--json-model-override-args) changed the config hash, and the
    # diff refused the pair as two targets; the weights agree, so the override is the mistake, said as one
    train = _synthetic(tmp_path / "t.trace", "train", BASE)
    serve = _synthetic(tmp_path / "s.trace", "serve", {**BASE, field: OTHER[field]}, diverge=True)
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 1, r.output  # compared: the rows diverge at the target's aux
    j = json.loads(r.stdout)
    assert j["first_divergence"]["tensor"] == "target.aux.0"
    warned = {m["field"]: m for m in j["contract_mismatches"] if m["severity"] == "warn"}
    assert set(warned) == {field}, warned
    m = warned[field]
    said = {"target_architecture": "'Qwen3MoeForCausalLM', serving 'DeepseekV3ForCausalLM'",
            "target_config_sha256": "cccccccccccc, serving dddddddddddd", "target_num_experts": "4, serving 8",
            "target_experts_per_token": "2, serving None"}[field]
    assert m["message"] == f"{field}: training {said} (acts from target.aux)", m["message"]
    assert "--json-model-override-args" in m["fix"] and m["stages"][0] == "target.aux"
    assert f"contract.{field}" in [e["cause"] for e in j["explanations"]]


def test_every_differing_identity_fact_is_in_the_one_line(tmp_path, run_cli):
    train = _synthetic(tmp_path / "t.trace", "train", BASE)
    serve = _synthetic(tmp_path / "s.trace", "serve", {**BASE, **OTHER})
    r = run_cli("diff", train, serve)
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1
    line = r.output
    assert [f for f in IDENTITY if f" {f} " in line] == list(IDENTITY)
    assert "DeepseekV3ForCausalLM (serving)" in line and "Qwen3MoeForCausalLM (training)" in line


def test_older_or_unknown_identity_is_not_compared_and_said_once(tmp_path, run_cli):
    old = {k: v for k, v in BASE.items() if k not in IDENTITY}
    train = _synthetic(tmp_path / "t.trace", "train", BASE)
    serve = _synthetic(tmp_path / "s.trace", "serve", old, diverge=True)
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 1, r.output  # compared as before: the rows diverge
    j = json.loads(r.stdout)
    assert j["first_divergence"]["tensor"] == "target.aux.0"
    said = [m for m in j["contract_mismatches"] if m["field"] == "target_identity"]
    assert [m["message"] for m in said] == ["serving records no target identity (a trace written before specdiff "
                                            "recorded it): whether both sides ran the same target is not compared"]
    both_old = _synthetic(tmp_path / "t0.trace", "train", old)
    j = json.loads(run_cli("diff", both_old, serve, "--format", "json").stdout)
    assert not [m for m in j["contract_mismatches"] if m["field"] == "target_identity"]  # as today

    unobs = [{"name": "VocabParallelEmbedding.weight", "sglang": "x", "source": "s", "tensors": [],
              "facts": ["target_weights_fingerprint"], "why": "gone", "sglang_version": "0.5.99"}]
    unknown = {**BASE, "target_weights_fingerprint": "unknown", "target_num_experts": "unknown",
               "unobservable": unobs}
    serve = _synthetic(tmp_path / "s2.trace", "serve", {**unknown, "target_architecture": BASE["target_architecture"]})
    r = run_cli("diff", train, serve, "--format", "json")
    assert r.exit_code == 0, r.output  # the known facts agree: compared, no divergence
    said = [m["message"] for m in json.loads(r.stdout)["contract_mismatches"] if "target" in m["message"]]
    assert said == ["target identity facts target_weights_fingerprint, target_num_experts are unknown on serving "
                    "(SGLang 0.5.99 has no VocabParallelEmbedding.weight): not compared"]


# ---- GPT-OSS: the pre-norm slot ------------------------------------------------------------------
@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    """A tiny GPT-OSS target (L = 8) and a draft whose SGLang ids are [0, 3, 8]: max id = L, so
    gpt_oss.py:1337-1352 keeps them literally and index 8 is the last layer's pre-norm output."""
    from specdiff.demo_models.bringup import build_draft
    from specdiff.demo_models.families import build_family_target

    root = tmp_path_factory.mktemp("gpt_oss")
    target = build_family_target("gpt_oss", root / "target", trained=False)
    build_draft(root / "draft", aux_layer_ids=[0, 3, 8])
    return target, root / "draft", root


def test_gpt_oss_prenorm_slot_is_the_final_norms_input(gpt_oss, run_cli):
    from specdiff.replay.model.target_capture import load_target

    target, draft, root = gpt_oss
    # a serving trace as the SGLang recorder writes it for this pair (tests/tracer/engines/test_family_contract.py checks
    # the live server says exactly this): slot 2 = capture index 8 = the pre-norm output
    served = {"engine": "sglang", "num_layers": 8, "aux_hf_indices": [0, 3, 8], "aux_concat_order": [0, 3, 8],
              "aux_prenorm_indices": [8], "spec_steps": 2, "spec_topk": 1, "model_name": str(target),
              "draft_name": str(draft)}
    with TraceWriter(str(root / "serve.trace"), side="serve", contract=served, overwrite=True) as tw:
        for i, s in enumerate(SEQS):
            tw.add_sequence(np.asarray(s, np.int32), prompt_len=5, rid=f"r{i}")
    out = root / "train.trace"
    c = _record(run_cli, target, draft, out, "--replay", root / "serve.trace", "--overwrite")
    assert c["aux_hf_indices"] == [0, 3, 8] and c["aux_concat_order"] == [0, 3, 8]
    assert c["aux_prenorm_indices"] == [8]
    assert any("sglang id 8 names the last decoder layer's output before the final norm" in n for n in c["notes"])

    # the pre-flight check reads training's layers as HF indices, where slot 2 would be hidden_states[8]: neither
    # the findings stored by record train nor those diff computes on the serving pair may claim a mismatch
    from specdiff.replay.diff.contract.findings import findings_of_kinds
    from specdiff.replay.diff.types import Pair

    assert not [f for f in c["findings"] if f["kind"].startswith("training.")], c["findings"]
    pair = Pair(open_trace(str(out)), open_trace(str(root / "serve.trace")))
    assert [f["kind"] for f in findings_of_kinds(pair, ("training.", "aux."))] == ["aux.prenorm_last"]
    trace = open_trace(str(out))
    for dtype in (torch.bfloat16, torch.float32):
        _check_slots_against_a_direct_forward(trace, load_target(target, dtype=dtype), dtype)


def _check_slots_against_a_direct_forward(trace, model, dtype):
    """Each recorded slot against a direct transformers forward of the same sequence, the last decoder
    layer's output read by a forward hook on that layer (not the final norm hook record train uses).

    In bf16 (the replay's dtype) slot 2 is that output to within bf16 rounding and far from HF
    hidden_states[8]. In fp32 (measured: slot 1 = HF 3 is already 0.09 relative away, random-weight
    GPT-OSS routing in bf16) slot 2 is still nearest to it among all HF states, by half the next error."""
    for seq in trace.sequences:
        cands = _candidates(model, seq.tokens)
        for j, want in ((0, 0), (1, 3), (2, 9)):
            err = _slot_errors(trace, seq.id, j, cands)
            if dtype == torch.bfloat16:
                assert err[want] < 1e-2, (seq.id, j, err)
            assert int(np.argmin(err)) == want, (dtype, seq.id, j, err)
            assert err[want] < 0.5 * min(e for i, e in enumerate(err) if i != want), (dtype, seq.id, j, err)
        if dtype == torch.bfloat16:
            # HF hidden_states[8], after the final norm, is another tensor
            assert _slot_errors(trace, seq.id, 2, cands)[8] > 0.5


def _candidates(model, tokens) -> list[torch.Tensor]:
    """HF hidden_states 0..L of one sequence [T, H] fp32, then (index L + 1) the last decoder layer's
    output, read by a forward hook on that layer."""
    last = []
    hook = model.model.layers[-1].register_forward_hook(
        lambda _m, _i, o: last.append((o[0] if isinstance(o, tuple) else o)[0].float()))
    with torch.no_grad():
        hs = model(input_ids=torch.as_tensor(np.asarray(tokens, np.int64))[None], output_hidden_states=True).hidden_states
    hook.remove()
    assert len(last) == 1
    return [h[0].float() for h in hs] + last


def _slot_errors(trace, seq_id: int, j: int, cands) -> list[float]:
    """Relative error of slot ``target.aux.{j}``'s rows of one sequence against each candidate."""
    keys = trace.keys(f"target.aux.{j}")
    sel = np.where(keys["seq"] == seq_id)[0]
    got = torch.as_tensor(trace.read(f"target.aux.{j}")[sel].astype(np.float32))
    pos = torch.as_tensor(keys["pos"][sel].astype(np.int64))
    return [float((got - c[pos]).norm() / c[pos].norm()) for c in cands]


def test_an_id_the_engine_never_captures_is_still_refused(gpt_oss, run_cli, tmp_path):
    target, draft, _ = gpt_oss
    # max(id) 9 != L: the plus-one branch of gpt_oss.py:1337-1352 -> capture index 10, which no layer reaches
    r = run_cli("record", "train", "--target", target, "--draft", draft, "-o", tmp_path / "x.trace",
                "--prompts", _prompts(tmp_path / "p.jsonl"), "--aux-layers", "0,3,9", "--aux-convention", "sglang")
    assert r.exit_code == 2, r.output
    assert r.output.startswith("specdiff: error: aux layers: sglang id 9 captures nothing on GptOssForCausalLM")


@pytest.mark.parametrize("ids, convention, hf, prenorm", [
    ([0, 3, 8], "sglang", (0, 3, 8), (8,)),      # max(id) = L: literal, index 8 pre-norm (gpt_oss.py:726-738)
    ([0, 3, 7], "sglang", (1, 4, 8), (8,)),      # plus-one branch: 7 -> capture index 8 = L, pre-norm too
    ([0, 3, 6], "sglang", (1, 4, 7), ()),        # no index reaches L
    ([8, 0, 3], "sglang", (8, 0, 3), (8,)),      # training's listed order kept
    ([0, 3, 8], "hf", (0, 3, 8), ()),            # HF index L is after the final norm, as HF defines it
])
def test_ids_that_name_the_prenorm_output_in_their_convention(gpt_oss, ids, convention, hf, prenorm):
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.record.train_aux import resolve_train_aux

    _, draft, _ = gpt_oss
    res = resolve_train_aux(load_draft(draft), 8, ids, convention, architecture="GptOssForCausalLM")
    assert (res.hf_indices, res.prenorm) == (hf, prenorm)
    assert res.as_facts()["aux_prenorm_indices"] == list(prenorm)


@pytest.mark.parametrize("ids, convention, architecture, message", [
    ([0, 8, 8], "sglang", "GptOssForCausalLM", "name the last layer's pre-norm output twice"),
    ([0, 3, 7], "sglang", "LlamaForCausalLM", "SGLang id 7 (= L-1) names capture index 8, which SGLang never "
                                              "reaches"),
    ([0, 3, 9], "vllm", "GptOssForCausalLM", "vLLM aux id 9 out of range 0..8"),
    # other tools' pre-norm ids keep resolve_aux_ids' refusal (tests/replay/record/test_train_order.py pins it)
    ([0, 3, 8], "vllm", "GptOssForCausalLM", "before the final norm"),
    ([0, 3, 7], "specforge", "GptOssForCausalLM", "before the final norm"),
])
def test_ids_no_engine_captures_keep_their_refusal(gpt_oss, ids, convention, architecture, message):
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.record.train_aux import resolve_train_aux
    from specdiff.replay.trainers.errors import RecordTrainError

    _, draft, _ = gpt_oss
    with pytest.raises(RecordTrainError, match="aux layers: ") as e:
        resolve_train_aux(load_draft(draft), 8, ids, convention, architecture=architecture)
    assert message in str(e.value)
