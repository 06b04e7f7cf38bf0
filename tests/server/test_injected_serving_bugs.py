"""Serving bugs put into a real SGLang 0.5.23 CPU server by a test-owned plugin, found as a user would:
the server traced (``SPECDIFF_TRACE``), ``record train --replay``, ``diff``; and a
rope mistake in the served draft config only (``partial_rotary_factor``), no plugin needed.

The plugin (tests/server/bug_plugins/specdiff_bug_plugins.py) is loaded through SGLang's own plugin entry
point, like specdiff's recorder, and ``SPECDIFF_TEST_BUG`` picks one bug per server: draft
positions one too far at depth >= 1, the draft KV of a radix-cached prefix missing, stale draft KV
after verify, one wrong draft input token at each chunked-prefill boundary. Every server, the
control included, runs with ``--chunked-prefill-size 16`` (the demo prompts, 27-46 tokens, are
prefilled in 2-3 chunks) and gets each prompt twice (the second one hits the radix cache), so the
control shows those paths clean. One server per kind: the recorder writes one trace per server
process and each kind needs its own trace.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support.bug_server import CHUNK, diff_both, injected, serve_traced

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.demo.scenarios import write_served_draft

pytestmark = [pytest.mark.server, pytest.mark.slow]

if not (REPO_MODELS / "draft" / "config.json").exists():
    pytest.skip("the demo models are not built", allow_module_level=True)


@pytest.fixture(scope="module")
def served_draft(tmp_path_factory) -> Path:
    return write_served_draft("correct", REPO_MODELS / "draft", tmp_path_factory.mktemp("draft") / "draft")


def logged_cache_hits(tmp_path: Path) -> list[int]:
    """The non-zero ``#cached-token: N`` of SGLang's "Prefill batch" log lines, in order (one request
    a batch here)."""
    log = (tmp_path / "server.log").read_text()
    return [int(n) for n in re.findall(r"Prefill batch.*?#cached-token: (\d+)", log) if int(n)]


diff = diff_both  # the name the tests below read


def test_control_chunked_prefill_and_radix_repeats_without_a_bug_are_clean(tmp_path, served_draft, server_env):
    from specdiff.tracer.store import open_trace

    train, serve = serve_traced(tmp_path, served_draft, server_env, None)
    proc, report, text = diff(train, serve)
    assert proc.returncode == 0, text
    assert report["first_divergence"] is None
    # what the recorder read per request from the live Req / ScheduleBatch (tracer/engines/sglang/prefill.py),
    # against SGLang's own log of each prefill's cache hit
    trace = open_trace(serve)
    facts = [trace.contract["request_prefill"][s.rid] for s in trace.sequences]
    assert "injected" not in (tmp_path / "server.log").read_text()  # the plugin loaded, no bug put in
    hits = logged_cache_hits(tmp_path)
    assert len(hits) == 2 and all(h > 0 for h in hits), hits
    for (first, repeat), ids, hit in zip(zip(facts[::2], facts[1::2]), demo_prompts(REPO_MODELS, 2), hits,
                                         strict=True):
        n = len(ids)
        assert first == {"cached_prefix": 0, "chunks": [[p, min(CHUNK, n - p)] for p in range(0, n, CHUNK)]}, first
        assert repeat == {"cached_prefix": hit, "chunks": [[hit, n - hit]]}, repeat
    # the draft re-run (narrow, graft, the context proof) covers the repeats too: their cached prefix
    # holds no aux row, so it is taken from the serving rows of the request that computed it
    from specdiff.replay.diff.pipeline import diff_traces
    from specdiff.replay.diff.runner import replay_plan, sides

    rep = diff_traces(str(train), str(serve), narrow=False)
    tr, sv = sides(rep.inputs)
    plan = {s.seq_train: s for s in replay_plan(rep.inputs, tr, sv)}
    assert len(plan) == len(rep.alignment.seq_pairs), (len(plan), len(rep.alignment.seq_pairs))
    keys = trace.keys("target.aux_cat")
    for p in rep.alignment.seq_pairs:
        s, seq = plan[getattr(p.seq, tr)], getattr(p.seq, sv)
        hit = facts[seq]["cached_prefix"]  # a repeat follows the first request of its prompt
        if hit:
            assert s.n > hit and set(keys["seq"][s.rows[sv][:hit]].tolist()) == {seq - 1}, (seq, hit)
        assert set(keys["seq"][s.rows[sv][hit:]].tolist()) == {seq}
        assert keys["pos"][s.rows[sv]].tolist() == list(range(s.n))



def found(tmp_path, served_draft, server_env, bug) -> tuple[dict, str]:
    """Serve with ``bug``, diff: exit 1, the plugin really ran, no narrowing that could contradict the
    named cause (it runs only when no cause is named). Returns the JSON report and the text."""
    proc, report, text = diff(*serve_traced(tmp_path, served_draft, server_env, bug))
    assert injected(tmp_path, bug)
    assert proc.returncode == 1, text
    assert report["explanations"], text
    assert report["narrowing"] is None, report["narrowing"]
    return report, text


def test_draft_positions_one_too_far_at_depth_1_and_deeper(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "positions")
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("draft.positions", 1), first
    assert first["worst"]["y"] == first["worst"]["x"] + 1, first["worst"]
    cause = report["explanations"][0]
    assert cause["cause"] == "position_offset_depth", cause
    assert "+1 at depth >= 1" in cause["message"] and "advanced before each draft step" in cause["message"]
    assert any(line.startswith("depth 0: 100.0%") and line.endswith("+0") for line in cause["evidence"])
    assert text.startswith("first divergence: draft.positions")


def test_draft_kv_of_a_radix_cached_prefix_missing(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "cache_hit_kv")
    first = report["first_divergence"]
    assert first["tensor"] == "draft.hidden_out", first
    cause = report["explanations"][0]
    assert cause["cause"] == "cached_prefix_draft_kv", cause
    hits = logged_cache_hits(tmp_path)  # the repeats (seqs 1 and 3), as SGLang logged them
    assert cause["evidence"][0] == (f"requests that hit the cache: seq 1 (cached prefix {hits[0]}, first failing pos "
                                    f"{hits[0]}), seq 3 (cached prefix {hits[1]}, first failing pos {hits[1]})")
    assert (first["seq"], first["pos"]) == (1, hits[0]), first
    assert any("counted rows of requests without a cache hit agree" in line for line in cause["evidence"])
    assert "only on requests whose prefix hit the radix cache" in cause["message"]


def test_stale_draft_kv_after_verify(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "stale_kv")
    first = report["first_divergence"]
    assert first["tensor"] == "draft.hidden_out", first
    cause = report["explanations"][0]
    assert cause["cause"] == "stale_draft_kv", cause
    assert "only after a round boundary" in cause["message"] and "never in the prefill" in cause["message"]
    assert "draft.attn_in agrees on" in cause["message"]


def test_one_wrong_draft_input_token_at_each_chunked_prefill_boundary(tmp_path, served_draft, server_env):
    report, text = found(tmp_path, served_draft, server_env, "chunk_token")
    first = report["first_divergence"]
    assert (first["tensor"], first["depth"]) == ("tokens", 0), first
    assert (first["pos"] + 1) % CHUNK == 0, first  # the last row of a full chunk
    cause = report["explanations"][0]
    assert cause["cause"] == "chunk_boundary_token", cause
    assert "only at chunked-prefill boundaries" in cause["message"]
    assert cause["evidence"][0].startswith("prefill chunks recorded per request: seq 0: chunks end at pos 15, 31")


def test_a_partial_rope_on_the_served_draft_only_is_the_contract_cause(tmp_path, served_draft, server_env):
    """No plugin: the served draft's config says ``partial_rotary_factor: 0.5`` (SGLang's llama attention
    rotates head_dim * 0.5 dims, srt/models/llama.py:199-200), training used the whole head. The draft's
    depth-0 attention output is the first to differ, and the recorder read the factor off the live
    rope, so the contract difference is the named cause, with the pre-flight finding beside it."""
    partial = tmp_path / "partial-draft"
    shutil.copytree(served_draft, partial)
    cfg = json.loads((partial / "config.json").read_text())
    (partial / "config.json").write_text(json.dumps({**cfg, "partial_rotary_factor": 0.5}, indent=1))
    train, serve = serve_traced(tmp_path, partial, server_env, None)
    proc, report, text = diff(train, serve)
    assert proc.returncode == 1, text
    first = report["first_divergence"]
    # depth 0 first: deeper draft steps feed the differing output back (their attn_in differs by inheritance)
    assert (first["tensor"], first["depth"]) == ("draft.hidden_out", 0), first
    cause = report["explanations"][0]
    assert cause["cause"] == "contract.partial_rotary_factor", cause
    assert "contract partial_rotary_factor: 1.0 vs 0.5" in cause["evidence"], cause["evidence"]
    assert "no known cause" not in text and report["narrowing"] is None
    assert any(f["kind"] == "rope.partial_rotary" for f in report["preflight_findings"]), report["preflight_findings"]
