"""``record train`` does what training did, as the user said it: the aux concat order is kept
(``aux_concat_order``), input that cannot be used as given is refused in one line, and every
default filled in is printed and stored (``defaults_used``).

The end-to-end case (a draft trained on HF [6, 0, 3] served by a real SGLang server, which
concatenates ascending) is ``test_aux_concat_order_permutation_is_found_at_the_aux_stage`` in
tests/server/test_scenarios.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")


from specdiff.demo.scenarios import TRAINED_HF, reorder_fc_blocks, write_served_draft  # noqa: E402
from specdiff.eagle3.aux_layers import ConventionError, resolve_aux_ids  # noqa: E402
from specdiff.replay.diff.contract.check import check_contracts  # noqa: E402
from specdiff.replay.diff.types import Pair  # noqa: E402
from specdiff.replay.model.target_capture import TargetError, capture_target, load_target  # noqa: E402
from specdiff.replay.preflight.check import run_preflight  # noqa: E402
from specdiff.tracer.contract import AUX_CONCAT_ORDER, aux_slot_layers  # noqa: E402
from specdiff.tracer.contract_fields import DEFAULTS_USED
from specdiff.tracer.store import TraceWriter, open_trace  # noqa: E402

torch.set_num_threads(2)
MODELS = Path(__file__).resolve().parents[3] / "traces" / "models"
TARGET, DRAFT = MODELS / "target", MODELS / "draft"
L = 8

needs_models = pytest.mark.skipif(not (DRAFT / "config.json").is_file() or not (TARGET / "config.json").is_file(),
                                  reason="the demo models are not built (traces/models)")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    p.write_text(json.dumps({"input_ids": [1, 17, 33, 51, 90, 12, 7, 300, 41, 42, 43, 44], "prompt_len": 5}) + "\n"
                 + json.dumps({"input_ids": [1, 5, 6, 7, 8, 9, 10, 11]}) + "\n")
    return p


# ---- the resolution -----------------------------------------------------------------------
def test_trainer_order_is_kept_and_engine_order_is_ascending():
    listed = resolve_aux_ids([6, 0, 3], convention="hf", num_layers=L, concat="listed")
    assert listed.hf_indices == (6, 0, 3) and listed.captured == (0, 3, 6) and listed.notes == ()
    facts = listed.as_facts()
    assert facts[AUX_CONCAT_ORDER] == [6, 0, 3] and facts["aux_hf_indices"] == [0, 3, 6]
    engine = resolve_aux_ids([5, -1, 2], convention="sglang", num_layers=L)
    assert engine.hf_indices == (0, 3, 6) and engine.as_facts()[AUX_CONCAT_ORDER] == [0, 3, 6]
    # the same ids read the trainer's way keep their order in every convention
    assert resolve_aux_ids([5, -1, 2], convention="sglang", num_layers=L, concat="listed").hf_indices == (6, 0, 3)
    assert resolve_aux_ids([5, 0, 2], convention="specforge", num_layers=L, concat="listed").hf_indices == (6, 1, 3)


@pytest.mark.parametrize("ids,conv,words", [([3, 3, 6], "hf", "twice"), ([2, -1, 2], "sglang", "twice"),
                                            ([0, 3, L - 1], "sglang", "never reaches"),
                                            ([0, 3, L], "vllm", "before the final norm"),
                                            ([0, 3, L - 1], "specforge", "before the final norm")])
def test_trainer_ids_that_cannot_be_used_as_given_are_refused(ids, conv, words):
    with pytest.raises(ConventionError, match=words):
        resolve_aux_ids(ids, convention=conv, num_layers=L, concat="listed")


def test_slot_layers_of_old_traces_fall_back_to_the_captured_layers():
    assert aux_slot_layers({AUX_CONCAT_ORDER: [6, 0, 3], "aux_hf_indices": [0, 3, 6]}) == [6, 0, 3]
    assert aux_slot_layers({"aux_hf_indices": [0, 3, 6]}) == [0, 3, 6]
    assert aux_slot_layers({AUX_CONCAT_ORDER: "unknown"}) is None


# ---- the reference forward ----------------------------------------------------------------
@needs_models
def test_target_capture_concatenates_in_the_order_given():
    target = load_target(TARGET, dtype=torch.float32)
    ids = torch.tensor([[1, 17, 33, 51, 90, 12]])
    cap = capture_target(target, ids, [6, 0, 3], keep_all=True)
    assert cap.hf_indices == (6, 0, 3)
    hs = cap.hidden_states
    for j, i in enumerate((6, 0, 3)):
        assert torch.equal(cap.aux[j], hs[i])
    assert torch.equal(cap.aux_cat, torch.cat([hs[6], hs[0], hs[3]], dim=-1))
    with pytest.raises(TargetError, match="twice"):
        capture_target(target, ids, [3, 3, 6])


def test_reordered_fc_blocks_compute_the_same_on_the_reordered_concat():
    torch.manual_seed(0)
    H, hd = 4, 5
    fc = torch.randn(hd, 3 * H)
    hs = {i: torch.randn(2, H) for i in (0, 3, 6)}
    out = reorder_fc_blocks(fc, from_order=[0, 3, 6], to_order=[6, 0, 3])
    want = torch.cat([hs[0], hs[3], hs[6]], -1) @ fc.T
    torch.testing.assert_close(torch.cat([hs[6], hs[0], hs[3]], -1) @ out.T, want)
    assert not torch.allclose(torch.cat([hs[0], hs[3], hs[6]], -1) @ out.T, want)
    with pytest.raises(ValueError):
        reorder_fc_blocks(fc, from_order=[0, 3, 6], to_order=[0, 3, 7])


# ---- record train -------------------------------------------------------------------------
@needs_models
def test_record_train_keeps_the_users_aux_order_and_says_so(tmp_path, prompts, run_cli):
    """As reported: `--aux-layers 6,0,3 --aux-convention hf` used to print HF [0, 3, 6]."""
    draft = write_served_draft("aux-order", DRAFT, tmp_path / "draft-603")
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(draft), "--prompts", str(prompts),
                "-o", str(out), "--aux-layers", "6,0,3", "--aux-convention", "hf", "--steps", "2",
                "--probe-positions", "8")
    assert res.exit_code == 0, res.output
    assert "aux layers: HF [6, 0, 3] in this concat order" in res.stderr
    tr = open_trace(str(out))
    c = tr.contract
    assert c[AUX_CONCAT_ORDER] == [6, 0, 3] and c["aux_hf_indices"] == [0, 3, 6]
    assert c["aux_native_ids"] == [6, 0, 3] and c["aux_convention"] == "hf"
    # slot j holds the j-th layer the user named: compare with the layer probes of the same forward
    keys = tr.keys("target.probe.0")
    for j, i in enumerate((6, 0, 3)):
        probe = tr.read(f"target.probe.{i}", as_float32=True)
        slot_keys = tr.keys(f"target.aux.{j}")
        rows = {(int(s), int(p)): r for s, p, r in zip(slot_keys["seq"], slot_keys["pos"],
                                                     tr.read(f"target.aux.{j}", as_float32=True), strict=True)}
        np.testing.assert_array_equal(np.stack([rows[(int(s), int(p))] for s, p in zip(keys["seq"], keys["pos"],
                                                                                       strict=True)]), probe)
    # the draft trained on 6,0,3 and fed 6,0,3 computes what the demo draft computes on 0,3,6
    ref = tmp_path / "ref.trace"
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(DRAFT), "--prompts", str(prompts),
                "-o", str(ref), "--steps", "2", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    assert open_trace(str(ref)).contract["accept_cum_rate"] == c["accept_cum_rate"]


@needs_models
def test_draft_config_ids_out_of_order_are_used_as_listed_with_a_note(tmp_path, prompts, run_cli):
    draft = write_served_draft("aux-order", DRAFT, tmp_path / "draft-603")  # config ids [5, -1, 2]
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(draft), "--prompts", str(prompts),
                "-o", str(out), "--steps", "1", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    c = open_trace(str(out)).contract
    assert c[AUX_CONCAT_ORDER] == [6, 0, 3]
    used = c[DEFAULTS_USED]
    assert used["aux_layers"]["value"] == [6, 0, 3]
    assert "eagle_config.eagle_aux_hidden_state_layer_ids [5, -1, 2], in the order listed" in used["aux_layers"]["source"]
    assert "out of ascending order" in res.stderr and "SGLang concatenates HF [0, 3, 6]" in res.stderr


@needs_models
def test_every_default_filled_in_is_printed_and_stored(tmp_path, run_cli):
    serve = tmp_path / "serve.trace"
    w = TraceWriter(str(serve), side="serve", contract={"engine": "sglang", "spec_steps": 2, "spec_topk": 2,
                                                       "aux_hf_indices": [0, 3, 6]})
    w.add_sequence([1, 40, 41, 42, 43, 44, 45, 46, 47], prompt_len=4, rid="r0", seq_id=0)
    w.close()
    out = tmp_path / "train.trace"
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(DRAFT), "--replay", str(serve),
                "-o", str(out), "--dtype", "float32", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    contract = open_trace(str(out)).contract
    used = contract[DEFAULTS_USED]
    assert used["steps"] == {"value": 2, "source": "the serving trace's spec_steps"}
    assert used["topk"] == {"value": 2, "source": "the serving trace's spec_topk"}
    assert used["target_dtype"] == {"value": "bfloat16", "source": "record train default"}
    assert used["aux_layers"]["value"] == TRAINED_HF and used["aux_convention"]["value"] == "sglang"
    assert {"capture", "batch_size", "device", "max_new_tokens"} <= set(used)
    assert "dtype" not in used and "probe_positions" not in used  # given, not defaulted
    line = next(x for x in res.stderr.splitlines() if x.startswith("defaults used: "))
    assert "--steps 2 (the serving trace's spec_steps)" in line and "--target-dtype bfloat16" in line
    # --device follows the machine (it was cpu on a GPU machine), and the trace says what was used
    cuda = torch.cuda.is_available()
    assert used["device"] == {"value": "cuda" if cuda else "cpu",
                              "source": f"record train default: torch sees {'a' if cuda else 'no'} CUDA device"}
    assert contract["engine_options"]["device"] == used["device"]["value"]
    assert f"--device {used['device']['value']} (record train default: torch sees" in line


def test_the_default_device_is_cuda_where_torch_sees_one():
    from specdiff.replay.record.train_options import fill_defaults

    for cuda, device in ((True, "cuda"), (False, "cpu")):
        values, used = fill_defaults({"device": None, "dtype": None}, {}, cuda_available=cuda)
        assert values["device"] == used["device"]["value"] == device and values["dtype"] == "bfloat16"
    values, used = fill_defaults({"device": "cpu"}, {}, cuda_available=True)  # given: used as given
    assert values["device"] == "cpu" and "device" not in used


@needs_models
@pytest.mark.parametrize("extra,words", [
    (["--aux-layers", "3,3,6"], "HF hidden_states[3] twice"),
    (["--aux-layers", "6,,3"], "expected comma-separated integers"),
    (["--aux-layers", "0,3,7", "--aux-convention", "sglang"], "never reaches"),
    (["--aux-layers", "0,3,8", "--aux-convention", "vllm"], "before the final norm"),
    (["--aux-convention", "hf"], "--aux-layers, which is missing"),
    (["--steps", "0"], "--steps 0: must be >= 1"),
    (["--topk", "0"], "--topk 0: must be >= 1"),
    (["--batch-size", "0"], "--batch-size 0: must be >= 1"),
    (["--probe-positions", "-1"], "--probe-positions -1: must be >= 0"),
])
def test_input_that_cannot_be_used_as_given_is_one_error_line(tmp_path, prompts, extra, words, run_cli):
    out = tmp_path / "t.trace"
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(DRAFT), "--prompts", str(prompts),
                "-o", str(out), *extra)
    assert res.exit_code == 2, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdiff: error:") and words in lines[0], lines
    assert not out.exists()


@needs_models
def test_replayed_sequences_are_not_extended_and_prompt_len_is_not_clipped(tmp_path, run_cli):
    serve = tmp_path / "serve.trace"
    w = TraceWriter(str(serve), side="serve", contract={"engine": "sglang"})
    w.add_sequence([1, 40, 41, 42, 43], prompt_len=2, rid="r0", seq_id=0)
    w.close()
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(DRAFT), "--replay", str(serve),
                "-o", str(tmp_path / "a.trace"), "--max-new-tokens", "4")
    assert res.exit_code == 2 and "replayed exactly as served" in res.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"input_ids": [1, 2, 3], "prompt_len": 9}) + "\n")
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(DRAFT), "--prompts", str(bad),
                "-o", str(tmp_path / "b.trace"))
    assert res.exit_code == 2 and "prompt_len 9" in res.stderr and len(res.stderr.strip().splitlines()) == 1


# ---- what the diff side makes of it -------------------------------------------------------
@needs_models
def test_preflight_names_a_permuted_training_order_with_the_right_fix(tmp_path):
    report = run_preflight(TARGET, DRAFT, training_layers=[6, 0, 3], training_convention="hf")
    sg = [f for f in report.findings if f.engine == "sglang" and f.kind.startswith("training.")]
    assert [f.kind for f in sg] == ["training.aux_order"] and sg[0].severity == "error"
    assert "ascending order HF" in sg[0].message and "slot 0: trained on" in sg[0].message
    assert "reorder fc.weight's 3 column blocks from HF [6, 0, 3] to HF [0, 3, 6]" in sg[0].fix
    # the config already lists those layers: no "set the ids" advice that SGLang would ignore
    assert "eagle_aux_hidden_state_layer_ids" not in sg[0].fix


def test_contract_check_names_a_different_concat_order(tmp_path):
    paths = []
    for side, order in (("train", [6, 0, 3]), ("serve", [0, 3, 6])):
        p = tmp_path / f"{side}.trace"
        with TraceWriter(str(p), side=side, contract={"aux_hf_indices": [0, 3, 6], AUX_CONCAT_ORDER: order}) as w:
            w.add_sequence([1, 2, 3], prompt_len=1)
        paths.append(open_trace(str(p)))
    found = {m.field: m for m in check_contracts(Pair(*paths))}
    assert "aux_hf_indices" not in found
    m = found[AUX_CONCAT_ORDER]
    assert (m.x, m.y) == ([6, 0, 3], [0, 3, 6]) and "[6, 0, 3]" in m.message and "[0, 3, 6]" in m.message



@needs_models
def test_preflight_fix_for_other_layers_in_a_permuted_order_also_says_to_reorder(tmp_path):
    """Setting the ids alone cannot help a draft trained in a non-ascending order: engines sort."""
    report = run_preflight(TARGET, DRAFT, training_layers=[6, 1, 3], training_convention="hf")
    f = next(f for f in report.findings if f.engine == "sglang" and f.kind == "training.mismatch")
    assert f.fix.startswith("set eagle_config.eagle_aux_hidden_state_layer_ids = [0, 2, 5]")  # HF [1, 3, 6]
    assert "reorder fc.weight's 3 column blocks from HF [6, 1, 3] to HF [1, 3, 6]" in f.fix


@needs_models
def test_how_text_prompts_are_tokenized_is_a_stored_default(tmp_path, run_cli):
    if not (TARGET / "tokenizer.json").is_file():
        pytest.skip("the demo target has no tokenizer")
    p = tmp_path / "text.jsonl"
    p.write_text(json.dumps({"prompt": "import os\n", "completion": "def main():\n    return 1\n"}) + "\n")
    out = tmp_path / "t.trace"
    res = run_cli("record", "train", "--target", str(TARGET), "--draft", str(DRAFT), "--prompts", str(p),
                "-o", str(out), "--steps", "1", "--probe-positions", "0")
    assert res.exit_code == 0, res.output
    used = open_trace(str(out)).contract[DEFAULTS_USED]
    assert used["text_special_tokens"]["value"] is True and "BOS" in used["text_special_tokens"]["source"]
    assert "text_special_tokens True (record train default: text prompts" in res.stderr


def test_converting_a_checkpoint_keeps_the_aux_id_order(tmp_path):
    from specdiff.eagle3.norms import NORMS_OFF
    from specdiff.replay.model.checkpoint import load_draft, save_draft
    from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig

    cfg = Eagle3DraftConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, vocab_size=128, draft_vocab_size=64, num_aux=3, target_hidden_size=32,
                            rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, **NORMS_OFF,
                            eagle_aux_hidden_state_layer_ids=[5, -1, 2], aux_convention="sglang")
    save_draft(Eagle3Draft(cfg), tmp_path / "spec", "speculators", target_num_layers=L)
    loaded = load_draft(tmp_path / "spec")
    assert loaded.config.eagle_aux_hidden_state_layer_ids == [6, 0, 3]  # vLLM ids = HF, same order
