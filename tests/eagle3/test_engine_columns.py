"""The ``EngineSpec`` columns where the engines differ on a draft, pinned to the engine sources they were read
from (SGLang in this venv, vLLM in .venv-vllm; an engine not installed skips its rows), and the columns'
shapes every reader relies on."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from specdiff.eagle3.engines import FAMILY_CONVENTIONS, REGISTRY, SGLANG, VLLM

ROOT = Path(__file__).resolve().parents[2]
_SG = importlib.util.find_spec("sglang")
SITES = {
    "sglang": Path(_SG.origin).parent if _SG is not None and _SG.origin else None,
    "vllm": next((ROOT / ".venv-vllm" / "lib").glob("python3*/site-packages/vllm"), None),
}

#: (engine, column, its value, file under the engine's package, first-last line, text those lines hold)
PINS = [
    ("sglang", "later_input_norm", "hidden_norm", "srt/models/llama_eagle3.py", (103, 105),
     "self.hidden_norm(hidden_states, residual)"),
    ("vllm", "later_input_norm", "input_layernorm", "model_executor/models/llama_eagle3.py", (136, 138),
     "self.input_layernorm(hidden_states, residual)"),
    ("vllm", "norm_before_residual", True, "model_executor/models/llama_eagle3.py", (101, 104),
     "self._residual_norm = self._norm_before_residual"),
    ("sglang", "fc_slots_from_config", True, "srt/models/llama_eagle3.py", (156, 161),
     "self.num_aux_hidden_states = len(layer_ids) if layer_ids else 3"),
    # vLLM builds fc from the config too, its count leaving out the top-level ids: pre-flight reads fc.weight
    ("vllm", "fc_slots_from_config", False, "model_executor/models/llama_eagle3.py", (209, 216),
     "self.num_aux_hidden_states = len(layer_ids) if layer_ids else 3"),
    ("vllm", "prenorm_capture_site", "llama.py:438-441", "model_executor/models/llama.py", (438, 441),
     "aux_hidden_states, idx + 1, hidden_states, residual"),
    ("sglang", "fc_skip_at_width", True, "srt/models/llama_eagle3.py", (238, 247),
     "if hidden_states.shape[-1] != embeds.shape[-1]:"),
    ("sglang", "draft_window_option", "--speculative-draft-window-size", "srt/models/llama_eagle3.py", (286, 299),
     "speculative_draft_window_size"),
    ("vllm", "draft_window_option", "", "model_executor/models/llama.py", (185, 204),
     'is_sliding = layer_types[effective_layer_idx] == "sliding_attention"'),
    ("sglang", "replaces_draft_embed", True, "srt/speculative/eagle_worker_v2.py", (363, 363),
     "self.draft_runner.model.set_embed(embed)"),
    ("vllm", "replaces_draft_embed", False, "model_executor/models/llama_eagle3.py", (445, 461),
     'orig_to_new_substr["embed_tokens"] = None'),
]


@pytest.mark.parametrize(("engine", "column", "value", "path", "lines", "text"), PINS,
                         ids=[f"{p[0]}-{p[1]}" for p in PINS])
def test_a_column_holds_what_the_engine_source_says(engine, column, value, path, lines, text):
    assert getattr(REGISTRY[engine], column) == value
    site = SITES[engine]
    if site is None:
        pytest.skip(f"{engine} is not installed here")
    held = "\n".join((site / path).read_text().splitlines()[lines[0] - 1:lines[1]])
    assert text in held, f"{engine} {path}:{lines[0]}-{lines[1]} no longer holds {text!r}"


def test_sglang_never_reads_norm_before_residual():
    assert not SGLANG.norm_before_residual
    if SITES["sglang"] is None:
        pytest.skip("sglang is not installed here")
    assert "norm_before_residual" not in (SITES["sglang"] / "srt/models/llama_eagle3.py").read_text()


def test_every_engine_words_its_slot_crash_and_the_family_conventions_are_sglangs():
    for spec in REGISTRY.values():
        assert spec.slot_crash.format(got=128, want=192)  # every engine has one; only {got} / {want} in it
        assert spec.later_input_norm in ("hidden_norm", "input_layernorm")
    assert "192" in VLLM.slot_crash.format(got=128, want=192)
    assert FAMILY_CONVENTIONS == {SGLANG.aux_convention}


def test_the_sites_a_finding_cites_are_the_lines_pinned_for_their_column():
    pinned = {(p[0], p[1]): f"{Path(p[3]).name}:{p[4][0]}-{p[4][1]}" for p in PINS}
    for spec in REGISTRY.values():
        assert spec.later_input_norm_site == pinned[(spec.name, "later_input_norm")]
        if spec.draft_window_option:
            assert spec.draft_window_site == pinned[(spec.name, "draft_window_option")]
