"""SGLang 0.5.23 aux-id rules per target family, pinned to the installed wheel.

SGLang numbers EAGLE-3 aux ids per model file (``set_eagle3_layers_to_capture``): Llama, Qwen3,
Qwen3-MoE ... add 1; DeepSeek-V2/V3 (Kimi-K2) read the ids literally unless the first is 1;
GPT-OSS reads them literally when max(id) = L. ``specdiff check`` must read the target's
architecture and give the family-correct verdict and fix.

Targets are config.json only (``check`` never reads a target's weights or needs a tokenizer):
each family's transformers config class, 8 layers, saved with its architecture; a Kimi-K2.5
style wrapper nests a DeepseekV3 ``text_config``. The draft is a real EAGLE-3 checkpoint
(SpecForge format) trained on HF [0, 3, 6] = [embedding, out L2, out L5].
"""

from __future__ import annotations

import ast
import json
import shutil
from pathlib import Path

import pytest
from builders import random_specforge_draft

from specdiff.eagle3.aux_layers import (
    ConventionError,
    engine_capture,
    native_aux_ids,
    resolve_aux_ids,
    target_architecture,
)
from specdiff.eagle3.families import SGLANG_FAMILIES, SGLANG_OPAQUE, SGLANG_WRAPPERS, sglang_family_rule
from specdiff.replay.preflight.check import run_preflight

L, H, V, VD = 8, 64, 256, 128
ROOT = Path(__file__).resolve().parents[2]
TRAIN_HF = (0, 3, 6)
DIMS = dict(num_hidden_layers=L, hidden_size=H, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=V, max_position_embeddings=512, eos_token_id=1, bos_token_id=0)


def _config(family: str) -> dict:
    """config.json of a tiny 8-layer target of ``family`` (transformers 5.19 config classes)."""
    import transformers as tf

    moe = dict(moe_intermediate_size=32)
    build = {
        "llama": lambda: tf.LlamaConfig(architectures=["LlamaForCausalLM"], **DIMS),
        "qwen3": lambda: tf.Qwen3Config(architectures=["Qwen3ForCausalLM"], head_dim=16, **DIMS),
        "qwen3_moe": lambda: tf.Qwen3MoeConfig(architectures=["Qwen3MoeForCausalLM"], head_dim=16, num_experts=4,
                                               num_experts_per_tok=2, **moe, **DIMS),
        "deepseek_v3": lambda: tf.DeepseekV3Config(
            architectures=["DeepseekV3ForCausalLM"], kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16,
            qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2,
            n_group=1, topk_group=1, first_k_dense_replace=1, **moe, **DIMS),
        "gpt_oss": lambda: tf.GptOssConfig(architectures=["GptOssForCausalLM"], head_dim=16, num_local_experts=4,
                                           num_experts_per_tok=2, **DIMS),
    }
    if family == "kimi_k25":  # SGLang kimi_k25.py:693 builds DeepseekV3ForCausalLM(config.text_config)
        text = _config("deepseek_v3")
        return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                "text_config": text, "vision_config": {"hidden_size": 32}}
    return build[family]().to_dict()


#: family, SGLang ids that feed HF [0, 3, 6], ids shifted by the other numbering
TABLE = [
    ("llama", [-1, 2, 5], [0, 3, 6]),
    ("qwen3", [-1, 2, 5], [0, 3, 6]),
    ("qwen3_moe", [-1, 2, 5], [0, 3, 6]),
    ("deepseek_v3", [0, 3, 6], [-1, 2, 5]),
    ("gpt_oss", [-1, 2, 5], [0, 3, 6]),
    ("kimi_k25", [0, 3, 6], [-1, 2, 5]),
]


@pytest.fixture(scope="module")
def draft_src(tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "draft"
    random_specforge_draft(out, aux_ids=[-1, 2, 5], hidden=H, vocab=V, draft_vocab=VD)
    return out


def _pair(tmp_path, draft_src, family: str, sglang_ids) -> tuple[Path, Path]:
    target = tmp_path / family
    target.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps(_config(family)))
    draft = tmp_path / "draft"
    shutil.copytree(draft_src, draft)
    c = json.loads((draft / "config.json").read_text())
    c["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(sglang_ids)
    c["eagle_aux_hidden_state_layer_ids"] = list(TRAIN_HF)  # vLLM ids = HF indices
    (draft / "config.json").write_text(json.dumps(c))
    return target, draft


def _kinds(report, engine="sglang"):
    return {f.kind: f for f in report.findings if f.engine in (engine, "all")}


# ---- check on each family: correct config clean, shifted config an error with the family fix ----
@pytest.mark.parametrize("family,correct,shifted", TABLE, ids=[r[0] for r in TABLE])
def test_check_on_each_family(tmp_path, draft_src, family, correct, shifted):
    target, draft = _pair(tmp_path / "ok", draft_src, family, correct)
    report = run_preflight(target, draft, training_layers=list(TRAIN_HF))
    assert not report.errors, [(f.kind, f.message) for f in report.errors]
    assert report.captures["sglang"].hf_indices == TRAIN_HF
    k = _kinds(report)
    assert "training.match" in k and "aux.family" in k and "aux.family_assumed" not in k
    assert report.target.architecture == target_architecture(json.loads((target / "config.json").read_text()))

    target, draft = _pair(tmp_path / "bad", draft_src, family, shifted)
    report = run_preflight(target, draft, training_layers=list(TRAIN_HF), engines=("sglang",))
    errors = {f.kind: f for f in report.errors}
    assert "training.mismatch" in errors or "aux.slot_count" in errors, list(errors)
    fixes = " | ".join(f.fix for f in report.errors)
    assert f"eagle_aux_hidden_state_layer_ids = {correct}" in fixes, fixes
    assert "training.match" not in _kinds(report)


def test_deepseek_minus_one_is_lost_and_the_packed_buffer_crashes(tmp_path, draft_src):
    # the motivating bug's config: [-1, 2, 5] on DeepSeek-V3 captures two slots (deepseek_v2.py:3473 literal, -1 matches
    # no layer) and the packer sized for 3 raises on the first request (aux_hidden_states.py:86-89)
    target, draft = _pair(tmp_path, draft_src, "deepseek_v3", [-1, 2, 5])
    report = run_preflight(target, draft, training_layers=list(TRAIN_HF), engines=("sglang",))
    cap = report.captures["sglang"]
    assert cap.hf_indices == (2, 5) and cap.dropped_ids == (-1,) and cap.outcome == "crash"
    assert "captured 2 of 3 aux hidden states" in cap.failure
    k = {f.kind: f for f in report.errors}
    assert k["aux.dropped_id"].engine == "sglang" and cap.family == "deepseek" and cap.family_known
    assert "[0, 3, 6]" in k["training.mismatch"].fix and "deepseek_v2.py:3458-3473" in k["training.mismatch"].fix


def test_deepseek_cli_example_from_the_issue(tmp_path, draft_src, run_cli):
    target, draft = _pair(tmp_path / "a", draft_src, "deepseek_v3", [0, 3, 6])
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", "0,3,6", "--engine", "sglang")
    assert r.exit_code == 0, r.output
    assert "training.match" in r.output and "training.mismatch" not in r.output
    target, draft = _pair(tmp_path / "b", draft_src, "deepseek_v3", [-1, 2, 5])
    r = run_cli("check", "--target", target, "--draft", draft, "--training-layers", "0,3,6", "--engine", "sglang")
    assert r.exit_code == 1 and "training.mismatch" in r.output


def test_gpt_oss_id_L_is_kept_literally_and_captured_before_the_final_norm(tmp_path, draft_src):
    # gpt_oss.py:1349-1350: max(ids) == L keeps the ids; capture index L is the updated residual
    # before the final norm (gpt_oss.py:726-738): a real slot, no crash, no HF index
    target, draft = _pair(tmp_path, draft_src, "gpt_oss", [0, 3, L])
    report = run_preflight(target, draft, engines=("sglang",))
    cap = report.captures["sglang"]
    assert cap.hf_indices == (0, 3) and cap.prenorm_ids == (L,) and cap.dropped_ids == () and cap.outcome == "ok"
    text = " ".join(f.message for f in report.findings)
    assert "silently drop" not in text and "crash" not in text
    f = _kinds(report)["aux.prenorm_last"]
    assert f.severity == "warn" and "before the final norm" in f.message and "gpt_oss.py:726-738" in f.message
    # the same ids on Llama: id 8 -> capture index 9, never reached
    target, draft = _pair(tmp_path / "l", draft_src, "llama", [0, 3, L])
    assert run_preflight(target, draft, engines=("sglang",)).captures["sglang"].dropped_ids == (L,)


def test_qwen3_moe_id_at_the_last_layer_crashes_at_start(tmp_path, draft_src):
    # qwen2_moe.py:1155-1156 flags self.layers[id + 1] when the server starts: index L is an IndexError
    target, draft = _pair(tmp_path, draft_src, "qwen3_moe", [-1, 2, L - 1])
    cap = run_preflight(target, draft, engines=("sglang",)).captures["sglang"]
    assert cap.outcome == "crash" and "IndexError when the server starts" in cap.failure


def test_unknown_or_missing_architecture_says_which_rule_was_assumed(tmp_path, draft_src):
    target, draft = _pair(tmp_path, draft_src, "llama", [-1, 2, 5])
    c = json.loads((target / "config.json").read_text())
    c["architectures"] = ["FancyNewForCausalLM"]
    (target / "config.json").write_text(json.dumps(c))
    f = _kinds(run_preflight(target, draft, engines=("sglang",)))["aux.family_assumed"]
    assert f.severity == "warn" and "plus-one" in f.message and "FancyNewForCausalLM" in f.message
    c["architectures"] = None
    (target / "config.json").write_text(json.dumps(c))
    f = _kinds(run_preflight(target, draft, engines=("sglang",)))["aux.family_assumed"]
    assert f.severity == "info" and "no architecture given" in f.message


def test_vllm_on_deepseek_says_its_own_forward_captures_in_the_mixin_numbering(tmp_path, draft_src):
    target, draft = _pair(tmp_path, draft_src, "deepseek_v3", [0, 3, 6])
    f = _kinds(run_preflight(target, draft), "vllm")["aux.family"]
    assert "deepseek_v2.py:1561-1568" in f.message and "id k = HF k" in f.message
    site = next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm/model_executor/models"), None)
    if site is None:
        pytest.skip("vLLM is not installed here")
    lines = (site / "deepseek_v2.py").read_text().splitlines()
    assert "if idx in self.aux_hidden_state_layers:" in lines[1560]
    assert "if self.end_layer in self.aux_hidden_state_layers:" in lines[1585]


# ---- resolve / native round trips per family -----------------------------------------------------
ARCHS = ["LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM", "GptOssForCausalLM",
         "KimiK25ForConditionalGeneration", "Glm4MoeLiteForCausalLM", "Gemma3ForConditionalGeneration"]
HF_SETS = [(0, 3, 6), (1, 4, 7), (2, 4, 5), (1, 2), (3, 7), (0,)]


@pytest.mark.parametrize("arch", ARCHS)
def test_native_ids_invert_each_family_rule(arch):
    for hf in HF_SETS:
        ids = native_aux_ids(hf, "sglang", num_layers=L, architecture=arch)
        assert resolve_aux_ids(ids, convention="sglang", num_layers=L, architecture=arch).hf_indices == hf, (arch, hf)
        plan = engine_capture("sglang", ids, num_layers=L, architecture=arch)
        assert plan.hf_indices == hf and not plan.dropped and not plan.failure
    with pytest.raises(ConventionError, match=f"HF index {L}"):
        native_aux_ids([2, L], "sglang", num_layers=L, architecture=arch)


def test_deepseek_inverse_avoids_a_leading_one_and_refuses_a_lone_one():
    ids = native_aux_ids([1, 4, 7], "sglang", num_layers=L, architecture="DeepseekV3ForCausalLM")
    assert ids[0] != 1 and sorted(ids) == [1, 4, 7]
    # read literally, [1, 4, 7] is shifted: the first id 1 turns on +1 (deepseek_v2.py:3470-3471)
    assert engine_capture("sglang", [1, 4, 6], num_layers=L, architecture="DeepseekV3ForCausalLM").hf_indices == (2, 5, 7)
    with pytest.raises(ConventionError, match="cannot express HF \\[1\\] alone"):
        native_aux_ids([1], "sglang", num_layers=L, architecture="DeepseekV3ForCausalLM")


def test_llama_architecture_gives_what_the_legacy_rule_gives():
    for ids in ([-1, 3, 6], [2, 5, 1], [1, 3, L - 1], None):
        old = resolve_aux_ids(ids, convention="sglang", num_layers=L)
        new = resolve_aux_ids(ids, convention="sglang", num_layers=L, architecture="LlamaForCausalLM")
        assert (old.hf_indices, old.dropped) == (new.hf_indices, new.dropped)
        assert engine_capture("sglang", ids, num_layers=L).hf_indices == \
            engine_capture("sglang", ids, num_layers=L, architecture="LlamaForCausalLM").hf_indices


def test_listed_refuses_ids_the_family_does_not_capture():
    with pytest.raises(ConventionError, match="captures nothing"):
        resolve_aux_ids([-1, 2, 5], convention="sglang", num_layers=L, concat="listed",
                        architecture="DeepseekV3ForCausalLM")
    with pytest.raises(ConventionError, match="before the final norm"):
        resolve_aux_ids([0, 3, L], convention="sglang", num_layers=L, concat="listed", architecture="GptOssForCausalLM")


def test_defaults_are_the_same_capture_indices_except_minimax_m3_vl():
    for arch in ARCHS:
        assert engine_capture("sglang", None, num_layers=L, architecture=arch).hf_indices == (2, 4, 5)
    assert engine_capture("sglang", None, num_layers=L,
                          architecture="MiniMaxM3SparseForConditionalGeneration").hf_indices == (3, 5, 6)


def test_target_architecture_reads_a_wrappers_text_config():
    assert target_architecture({"architectures": ["X"], "text_config": {"architectures": ["Y"]}}) == "X"
    assert target_architecture({"text_config": {"architectures": ["DeepseekV3ForCausalLM"]}}) == "DeepseekV3ForCausalLM"
    assert target_architecture({}) is None


# ---- each rule pinned to the installed SGLang ------------------------------------------------------
def _sglang_models() -> Path:
    import sglang

    return Path(sglang.__file__).parent / "srt" / "models"


PINNED = [
    ("llama.py", 941, "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
    ("qwen3.py", 791, "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
    ("qwen3_moe.py", 1143, "self.model.set_eagle3_layers_to_capture([val + 1 for val in layer_ids])"),
    ("qwen2_moe.py", 1156, 'setattr(self.layers[layer_id], "_is_layer_to_capture", True)'),
    ("deepseek_v2.py", 3470, "if layer_ids and layer_ids[0] == 1:"),
    ("deepseek_v2.py", 3471, "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
    ("deepseek_v2.py", 3473, "self.model.layers_to_capture = list(layer_ids)"),
    ("deepseek_v2.py", 3175, "aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture))"),
    ("glm4_moe_lite.py", 817, "if layer_ids and layer_ids[0] == 1:"),
    ("gpt_oss.py", 1349, "if layer_ids and max(layer_ids) == num_layers:"),
    ("gpt_oss.py", 1350, "self.model.layers_to_capture = list(layer_ids)"),
    ("gpt_oss.py", 1352, "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
    ("gpt_oss.py", 732, "if self.end_layer in self.layers_to_capture"),
    ("kimi_k25.py", 693, "self.language_model = DeepseekV3ForCausalLM("),
    ("kimi_k25.py", 939, "self.language_model.set_eagle3_layers_to_capture(layer_ids)"),
    ("gemma3_mm.py", 195, "self.language_model = Gemma3ForCausalLM("),
    ("mllama4.py", 496, "self.language_model = Llama4ForCausalLM("),
    ("minimax_m3_vl.py", 263, "self.model.layers_to_capture = [val + 1 for val in layer_ids]"),
    ("../layers/aux_hidden_states.py", 86, "if self._feature_size is None or self._idx != self._num_captures:"),
    ("../layers/layer_boundary/residual/access.py", 53, "capture(residual)"),
]


@pytest.mark.parametrize("path,line,text", PINNED, ids=[f"{p}:{n}" for p, n, _ in PINNED])
def test_cited_line_holds_the_rule_in_the_installed_sglang(path, line, text):
    src = (_sglang_models() / path).read_text().splitlines()
    assert src[line - 1].strip() == text


def _wheel_table() -> dict[str, tuple[str, int, int, str]]:
    """Every EntryClass architecture of the installed SGLang whose class (or a base) defines
    set_eagle3_layers_to_capture -> (file, first line, last line, rule read from the body)."""
    classes: dict[str, list] = {}
    entries: list[tuple[str, str]] = []
    for f in sorted(_sglang_models().glob("*.py")):
        text = f.read_text()
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                fn = next((b for b in node.body if isinstance(b, ast.FunctionDef)
                           and b.name == "set_eagle3_layers_to_capture"), None)
                classes.setdefault(node.name, []).append(
                    (f.name, [ast.unparse(b).split(".")[-1] for b in node.bases], fn and ast.get_source_segment(text, fn),
                     fn and fn.lineno))
            elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
                v = node.value
                entries += [(f.name, ast.unparse(e)) for e in (v.elts if isinstance(v, (ast.List, ast.Tuple)) else [v])]

    def resolve(name, file, seen=()):
        for fname, bases, body, line in sorted(classes.get(name, []), key=lambda c: c[0] != file):
            if body:
                return fname, line, line + body.count("\n"), body
            for b in bases:
                if b not in seen and (r := resolve(b, fname, seen + (name,))):
                    return r
        return None

    out = {}
    for file, name in entries:
        if r := resolve(name, file):
            fname, lo, hi, body = r
            rule = ("deepseek" if "layer_ids[0] == 1" in body else "gpt-oss" if "max(layer_ids) == num_layers" in body
                    else "wrapper" if "set_eagle3_layers_to_capture(layer_ids)" in body
                    else "plus-one" if "[val + 1 for val in layer_ids]" in body else "?")
            out[name] = (fname, lo, hi, rule)
    return out


def test_the_table_covers_every_sglang_architecture_with_the_rule_its_file_has():
    wheel = _wheel_table()
    assert len({v[0] for v in wheel.values()}) >= 25  # the 29 files minus model-level setters
    for arch, (fname, lo, _, rule) in wheel.items():
        fam = sglang_family_rule(arch)
        if rule == "wrapper":
            assert arch in SGLANG_WRAPPERS or arch in SGLANG_OPAQUE, arch
            continue
        assert arch in SGLANG_FAMILIES and fam.known, arch
        assert fam.name == rule, (arch, fam.name, rule)
        assert any(s.startswith(f"srt/models/{fname}:{lo}-") for s in fam.sources), (arch, fname, lo, fam.sources)
    for arch in SGLANG_WRAPPERS:
        assert wheel[arch][3] == "wrapper"


def test_every_family_rule_cites_its_source():
    for arch in list(SGLANG_FAMILIES) + list(SGLANG_WRAPPERS):
        fam = sglang_family_rule(arch)
        assert fam.known and fam.sources and fam.sources[0].startswith("srt/models/"), arch
    kimi = sglang_family_rule("KimiK25ForConditionalGeneration")
    assert kimi.name == "deepseek" and "kimi_k25.py:928-939" in kimi.sources[0]
    assert sglang_family_rule("MindSporeForCausalLM").known is False


# ---- record train reads SGLang ids by the target's rule -------------------------------------------
def test_record_train_aux_reads_sglang_ids_by_the_targets_rule(tmp_path, draft_src):
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.record.train_aux import resolve_train_aux
    from specdiff.replay.trainers.errors import RecordTrainError

    _, draft = _pair(tmp_path, draft_src, "deepseek_v3", [0, 3, 6])
    loaded = load_draft(draft)
    res = resolve_train_aux(loaded, L, architecture="DeepseekV3ForCausalLM")
    assert res.hf_indices == (0, 3, 6) and "deepseek rule" in res.notes[0]
    res = resolve_train_aux(loaded, L, architecture="LlamaForCausalLM")
    assert res.hf_indices == (1, 4, 7) and "plus-one rule" in res.notes[0]
    res = resolve_train_aux(loaded, L)  # no architecture: the rule assumed is said, not hidden
    assert res.hf_indices == (1, 4, 7) and "SGLang rule assumed: plus-one" in res.notes[0]
    with pytest.raises(RecordTrainError, match="captures nothing on DeepseekV3ForCausalLM"):
        resolve_train_aux(loaded, L, [-1, 2, 5], "sglang", architecture="DeepseekV3ForCausalLM")
    assert resolve_train_aux(loaded, L, [0, 3, 6], "hf", architecture="DeepseekV3ForCausalLM").notes == ()


# ---- diff's explanation writes its fix in the target's rule ------------------------------------
def test_explain_fix_uses_the_targets_rule_from_the_contract_or_the_evidence(tmp_path):
    from types import SimpleNamespace as T

    from specdiff.replay.diff.explain.aux import _sglang_fix

    train = T(contract={"num_layers": L})
    want = [0, 3, 6]
    fix, rule = _sglang_fix(want, T(contract={"num_layers": L, "target_architecture": "DeepseekV3ForCausalLM"}), train)
    assert rule == "deepseek" and "to [0, 3, 6] (SGLang deepseek rule of DeepseekV3ForCausalLM, " \
        "srt/models/deepseek_v2.py:3458-3473" in fix
    # no architecture recorded: the target directory the contract names (a Kimi-K2.5 wrapper)
    (tmp_path / "config.json").write_text(json.dumps(_config("kimi_k25")))
    fix, rule = _sglang_fix(want, T(contract={"num_layers": L, "model_name": str(tmp_path)}), train)
    assert rule == "deepseek" and "[0, 3, 6]" in fix and "KimiK25ForConditionalGeneration" in fix
    # neither: the serving contract's own ids and captured layers decide, when only one answer fits
    fix, rule = _sglang_fix(want, T(contract={"num_layers": L, "aux_native_ids": [2, 5, 6],
                                              "aux_hf_indices": [2, 5, 6]}), train)
    assert rule == "deepseek" and "to [0, 3, 6]" in fix and "read from the serving contract" in fix
    fix, rule = _sglang_fix(want, T(contract={"num_layers": L, "aux_native_ids": [2, 5, 6],
                                              "aux_hf_indices": [3, 6, 7]}), train)
    assert fix.endswith("to [-1, 2, 5] (SGLang convention for HF [0, 3, 6])")  # plus-one, evidenced
    fix, rule = _sglang_fix(want, T(contract={"num_layers": L}), train)
    assert "[-1, 2, 5]" in fix and "rule assumed: plus-one" in fix
