"""``specdiff info`` (tui/cmd_info.py) on a trace holding the facts read whole from the live objects: a
config, every engine option, every tensor's fingerprint are counted, not listed (hundreds of lines); the
small ones (the options the operator gave, the parameters left as allocated) are listed."""

from __future__ import annotations

from specdiff.tracer.store import TraceWriter


def test_whole_facts_are_counted_and_the_small_ones_listed(tmp_path, run_cli):
    path = tmp_path / "s.trace"
    contract = {"engine": "sglang", "engine_options": {f"opt_{i}": i for i in range(300)},
                "draft_config": {"hidden_size": 256, "num_hidden_layers": 2},
                "engine_options_given": {"speculative_draft_window_size": {"value": 4, "default": None}},
                "draft_unloaded": ["model.layers.1.self_attn.qkv_proj.weight"]}
    TraceWriter(str(path), side="serve", contract=contract).close()
    out = run_cli("info", path).output
    assert "engine_options           300 entries (each one: open_trace(path).contract['engine_options'])" in out
    assert "draft_config             2 entries" in out and "opt_17" not in out
    assert "speculative_draft_window_size" in out and "model.layers.1.self_attn.qkv_proj.weight" in out
