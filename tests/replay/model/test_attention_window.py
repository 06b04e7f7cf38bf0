"""Windowed draft attention: the draft config's ``layer_types`` / ``sliding_window``
(speculators' rule) and SGLang's ``--speculative-draft-window-size`` (``record train --draft-window``)
in the reference forward, the config files and the contract (eagle3/attention_window.py)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from specdiff.eagle3.attention_window import KV, PREFIX, config_windows, prefix_visible, window_fact
from specdiff.replay.model.checkpoint import load_draft
from specdiff.replay.model.draft_config import DraftConfigError, Eagle3DraftConfig
from specdiff.replay.model.draft_model import Eagle3Draft


def test_a_sliding_layer_sees_the_config_window_minus_one_and_full_layers_see_everything():
    dims = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}
    assert config_windows(dims, 2) == (7, None)
    assert config_windows({"layer_types": ["full_attention"]}, 1) is None
    assert config_windows({}, 1) is None
    with pytest.raises(ValueError, match="sliding_window is None"):
        config_windows({"layer_types": ["sliding_attention"]}, 1)
    with pytest.raises(ValueError, match="layer_types has 1 entries for num_hidden_layers 2"):
        config_windows({"layer_types": ["sliding_attention"], "sliding_window": 4}, 2)


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_sglang_counts_the_draft_tokens_speculators_does_not(depth):
    """Row t at depth k sees prefix row s: speculators iff t - s <= W, SGLang iff t + k - s <= W."""
    T, W = 12, 4
    kv, prefix = prefix_visible(T, depth, W, KV), prefix_visible(T, depth, W, PREFIX)
    for t in range(T):
        for s in range(T):
            assert bool(prefix[t, s]) == (s <= t and t - s <= W)
            assert bool(kv[t, s]) == (s <= t and t + depth - s <= W)
    assert torch.equal(kv, prefix) == (depth == 0)
    assert prefix_visible(T, depth, None, KV) is None


def _draft(tmp_path, repo_models, **changes) -> tuple[Eagle3Draft, Eagle3DraftConfig]:
    loaded = load_draft(repo_models / "draft")
    cfg = dataclasses.replace(loaded.config, **changes)
    loaded.model.config = cfg
    return loaded.model, cfg


def _inputs(cfg, T=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, T, cfg.aux_width, generator=g), torch.randint(0, cfg.vocab_size, (1, T), generator=g)


def test_a_window_wider_than_the_sequence_is_full_attention_bit_for_bit(tmp_path, repo_models):
    model, cfg = _draft(tmp_path, repo_models)
    aux, ids = _inputs(cfg)
    full = model.ttt_forward(aux, ids, 3)
    for rule in (KV, PREFIX):
        model.config = dataclasses.replace(cfg, attention_windows=(40,), window_distance=rule)
        wide = model.ttt_forward(aux, ids, 3)
        for k in range(3):
            assert torch.equal(wide.hidden_out[k], full.hidden_out[k]), (rule, k)


def test_a_row_outside_the_window_does_not_reach_the_query_and_one_inside_does(tmp_path, repo_models):
    """Depth 0, window W: row t's output depends on rows t-W..t only (one layer; the keys are the rows' own)."""
    W, t = 5, 20
    model, cfg = _draft(tmp_path, repo_models, attention_windows=(W,), window_distance=PREFIX)
    aux, ids = _inputs(cfg)
    base = model.ttt_forward(aux, ids, 1).hidden_out[0][0, t]
    for s, reaches in ((t - W - 1, False), (t - W, True)):
        moved = aux.clone()
        moved[0, s] += 3.0
        out = model.ttt_forward(moved, ids, 1).hidden_out[0][0, t]
        assert (not torch.equal(out, base)) == reaches, s


def test_the_windows_round_trip_through_both_config_formats_and_a_bad_one_names_its_key(tmp_path, repo_models):
    cfg = dataclasses.replace(load_draft(repo_models / "draft").config, attention_windows=(6,))
    for fmt in ("specforge", "speculators"):
        raw = cfg.to_json(fmt, aux_ids=None, torch_dtype="bfloat16")
        back = Eagle3DraftConfig.from_dict(raw, fmt=fmt)
        assert back.attention_windows == (6,) and back.window_distance == PREFIX
    raw = cfg.to_json("specforge", aux_ids=None, torch_dtype="bfloat16")
    assert raw["layer_types"] == ["sliding_attention"] and raw["sliding_window"] == 7
    raw["sliding_window"] = 0
    with pytest.raises(DraftConfigError) as e:
        Eagle3DraftConfig.from_dict(raw, source="x/config.json")
    assert e.value.field == "layer_types" and "sliding_window is 0" in str(e.value)


def test_sglangs_kv_window_is_not_written_as_speculators_keys(repo_models):
    """A config holds speculators' prefix rule only: SGLang's kv window written there would read back as another
    window at depth >= 1 (eagle3/attention_window.py), so writing it is refused, naming the server option."""
    cfg = dataclasses.replace(load_draft(repo_models / "draft").config, attention_windows=(8,), window_distance=KV)
    with pytest.raises(DraftConfigError) as e:
        cfg.to_json("specforge", aux_ids=None, torch_dtype="bfloat16")
    assert e.value.field == "window_distance" and "--speculative-draft-window-size" in str(e.value)


def _windowed_copy(tmp_path, repo_models):
    """The shipped draft with its one layer marked sliding, window 9 (speculators' keys: W = 8)."""
    windowed = tmp_path / "windowed"
    windowed.mkdir()
    for f in (repo_models / "draft").iterdir():
        (windowed / f.name).write_bytes(f.read_bytes())
    raw = json.loads((windowed / "config.json").read_text())
    (windowed / "config.json").write_text(json.dumps({**raw, "layer_types": ["sliding_attention"],
                                                      "sliding_window": 9}))
    return windowed


def test_a_bad_window_names_the_config_keys_it_came_from_in_each_format(repo_models):
    cfg = load_draft(repo_models / "draft").config
    with pytest.raises(DraftConfigError) as e:  # one window for a two-layer draft
        dataclasses.replace(cfg, format="speculators", num_hidden_layers=2, attention_windows=(6,))
    assert e.value.field == "transformer_layer_config.layer_types / transformer_layer_config.sliding_window"
    with pytest.raises(DraftConfigError) as e:
        dataclasses.replace(cfg, format="specforge", attention_windows=(-1,))
    assert e.value.field == "layer_types / sliding_window"


def test_record_train_refuses_a_window_it_cannot_compute_in_one_line(tmp_path, repo_models, run_cli):
    """--draft-window over a config that has its own windows, and SGLang's kv rule for speculators (which
    slides one window over the prefix): one line each, exit 2, no trace written."""
    pytest.importorskip("speculators")  # make install puts it in the main environment (--no-deps)
    serve = repo_models.parent / "examples" / "seed" / "serve.trace"
    cases = [((_windowed_copy(tmp_path, repo_models),), "the draft config already gives attention windows [8]"),
             ((repo_models / "draft", "--trainer", "speculators"), "speculators cannot compute the attention windows")]
    for (draft, *more), said in cases:
        out = tmp_path / "refused.trace"
        r = run_cli("record", "train", "--target", repo_models / "target", "--draft", draft, "--replay", serve,
                    "-o", out, "--draft-window", "8", *more)
        assert r.exit_code == 2, r.output
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and said in lines[0], r.stderr
        assert not out.exists()


def test_record_trains_draft_window_is_sglangs_rule_in_the_contract_and_refused_over_a_config_window(
        tmp_path, repo_models):
    loaded = load_draft(repo_models / "draft")
    loaded.serve_window(8)
    assert loaded.model.config.attention_windows == (8,) and loaded.config.window_distance == KV
    assert window_fact(loaded.config.attention_windows, loaded.config.window_distance, 1) == [
        {"window": 8, "distance": "kv"}]
    assert window_fact(None, PREFIX, 2) == [None, None]
    own = load_draft(_windowed_copy(tmp_path, repo_models))
    assert own.config.attention_windows == (8,) and own.config.window_distance == PREFIX
    from specdiff.replay.model.checkpoint import CheckpointError

    with pytest.raises(CheckpointError, match="already gives attention windows"):
        own.serve_window(8)
