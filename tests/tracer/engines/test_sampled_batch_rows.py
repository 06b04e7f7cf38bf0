"""A sampled request in a batch with one that is not recorded: only its rows are copied, and they
are the rows a trace of both requests holds for it.

Two real SGLang 0.5.23 CPU servers with the same settings (the committed demo pair, chain) serve the
same two requests in one batch (one ``/generate`` of two token lists: SGLang sends pre-tokenized
batches to the scheduler as one message, tokenizer_manager.py:2085-2087, so both are prefilled in
one forward and decoded together; threads would race the scheduler's receive loop, and a
different batching changes the CPU's rounding); one records both, the other ``SPECDIFF_RIDS``
chooses one. What needs no server (the row layouts, the renumbered verify indices) is beside them.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdiff.demo.run import REPO_MODELS, demo_prompts
from specdiff.tracer.engines.sglang.row_select import RowSelection, to_kept_rows
from specdiff.tracer.store import open_trace

RIDS = ("pair-kept", "pair-left")
NEW = 16


# ---- no server -----------------------------------------------------------------------------
def test_prefill_rows_follow_the_extend_lengths_and_requests_their_own_rows():
    sel = RowSelection([1, 3], 4, extend_lens=[2, 3, 1, 2])  # token rows: 0-1 | 2-4 | 5 | 6-7
    tokens = torch.arange(8 * 2).view(8, 2)
    assert sel.rows(tokens)[:, 0].tolist() == [4, 6, 8, 12, 14]
    assert sel.rows(torch.arange(4)).tolist() == [1, 3]  # one row a request (logits, seq_lens)
    assert sel.rows(torch.tensor([8])).tolist() == [8]  # not a batch tensor: as it is


def test_decode_rows_are_equal_blocks_and_one_run_is_a_view():
    sel = RowSelection([1, 2], 3)
    t = torch.arange(12)  # 3 requests x 4 verify rows
    got = sel.rows(t)
    assert got.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert got.data_ptr() == t[4:].data_ptr()  # adjacent requests: no copy before the host copy
    assert sel.rows(torch.arange(3 * 2).view(3, 2)).tolist() == [[2, 3], [4, 5]]
    assert RowSelection([0, 2], 3).rows(torch.arange(6)).tolist() == [0, 1, 4, 5]


def test_verify_indices_are_renumbered_for_the_kept_requests():
    # requests 1 and 3 of 4 kept, N = 4 verify rows each: absolute rows 4.. and 12.., -1 for none
    acc = torch.tensor([[4, 5, -1], [12, 13, 14]])
    assert to_kept_rows(acc, [1, 3], 4).tolist() == [[0, 1, -1], [4, 5, 6]]


# ---- the hooks' copies on stand-in engine objects (no server) --------------------------------
H, B, N, V, VD = 8, 3, 4, 16, 10  # hidden, batch, verify rows a request (chain: 3 steps + 1)
EXTEND = [2, 3, 4]


def _batch(rids, *, prefill: bool):
    """SGLang's ``ScheduleBatch`` as ``Recorder.begin`` reads it (prompts of ``EXTEND`` tokens)."""
    reqs = [SimpleNamespace(rid=r, origin_input_ids=list(range(1, e + 1)), sampling_params=None, cached_tokens=0)
            for r, e in zip(rids, EXTEND, strict=True)]
    return SimpleNamespace(reqs=reqs, forward_iter=0, forward_mode=SimpleNamespace(is_extend=lambda: prefill),
                           prefix_lens=[0] * B, extend_lens=list(EXTEND),
                           seq_lens=torch.tensor(EXTEND if prefill else [e + 1 for e in EXTEND]))


def _iterations() -> tuple[dict, dict]:
    """(prefill, decode) tensors of a B-request batch in SGLang 0.5.23's layouts (row_select.py)."""
    g = torch.Generator().manual_seed(0)

    def f(*s):
        return torch.randn(*s, generator=g).bfloat16()

    def i(*s, hi=VD):
        return torch.randint(0, hi, s, generator=g)

    def fwd(rows, last):  # a draft forward: its inputs over ``rows``, logits / hidden over ``last``
        return {"input_ids": i(rows), "positions": i(rows, hi=9), "hidden": f(last, H), "logits": f(last, VD).float(),
                "fc": (f(rows, 3 * H), f(rows, H)), "taps": {"draft.hidden_in": f(rows, H), "draft.hidden_out": f(rows, H)}}

    T = sum(EXTEND)
    prefill = {"target_aux": f(T, 3 * H), "target_logits": f(B, V).float(), "next_token_ids": i(B, hi=V),
               "draft": [("extend", fwd(T, B))], "de_topk_index": i(B, 1)}
    steps = [("decode", {**fwd(B, B), "fc": None}) for _ in range(2)]
    j = torch.arange(N)
    decode = {"target_aux": f(B * N, 3 * H), "target_logits": f(B * N, V).float(), "draft": [("extend_v2", fwd(B * N, B * N)), *steps],
              "de_topk_index": i(B, 1), "select": [i(B, 1) for _ in range(3)],
              "draft_token": i(B * N, hi=V), "verify_positions": i(B * N, hi=9),
              "retrieve_index": torch.arange(B * N).view(B, N), "retrieve_next_token": torch.where(j < N - 1, j + 1, -1).repeat(B, 1),
              "retrieve_next_sibling": torch.full((B, N), -1), "predict": i(B * N, hi=V), "accept_lens": torch.tensor([2, 4, 3]),
              "accept_index": torch.stack([torch.where(j < a, b * N + j, -1) for b, a in enumerate([2, 4, 3])])}
    return prefill, decode


def _hooks(rec, it: dict, batch) -> object:
    """What plugin.py's hooks copy in one iteration, in their order; the capture."""
    from specdiff.tracer.engines import target_logits

    cap = rec.begin(batch)
    assert cap is not None
    cap.t["target_aux"] = rec.snap(it["target_aux"])
    target_logits.stage(rec, cap.t, it["target_logits"], 4)
    if "next_token_ids" in it:
        cap.t["next_token_ids"] = rec.snap(it["next_token_ids"])
    for mode, d in it["draft"]:
        rec.fc_sink = [(rec.snap(d["fc"][0]), rec.snap(d["fc"][1]))] if d["fc"] is not None else []
        stages = {name: rec.snap(t) for name, t in d["taps"].items()}
        df = rec.capture_draft_forward(mode, SimpleNamespace(input_ids=d["input_ids"], positions=d["positions"]),
                                       SimpleNamespace(hidden_states=d["hidden"], next_token_logits=d["logits"]))
        df.stages, rec.fc_sink = stages, None
        cap.draft.append(df)
    cap.t["de_topk_index"] = rec.snap(it["de_topk_index"])
    for k, t in enumerate(it.get("select", ())):
        cap.select.append((k, rec.snap(t)))
    for key in ("draft_token", "verify_positions", "retrieve_index", "retrieve_next_token", "retrieve_next_sibling",
                "predict", "accept_lens", "accept_index"):
        if key in it:
            cap.t[key] = rec.snap(it[key])
    rec.cur = None
    return cap


def _record(tmp: Path, name: str, rids_re: str | None) -> tuple[str, list[int]]:
    """A prefill and a decode of ``RIDS_ALL`` through a real ``Recorder`` (``SPECDIFF_RIDS`` =
    ``rids_re``) and the writer's attribution into a real store; (its path, bytes copied a capture)."""
    from specdiff.tracer.engines.options import Options
    from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
    from specdiff.tracer.engines.sglang.attribution import write_capture
    from specdiff.tracer.engines.sglang.hooks import Recorder
    from specdiff.tracer.store import TraceWriter

    rec = Recorder(Options(path=str(tmp / name), rids=rids_re), SGLangAdapter("0.5.23", log=lambda m: None))
    rec.hidden_size, rec.num_aux, rec.topk = H, 3, 1
    sizes = []
    with TraceWriter(str(tmp / name), side="serve", contract={"engine": "test"}) as tw:
        for it, prefill in zip(_iterations(), (True, False), strict=True):
            cap = _hooks(rec, it, _batch(RIDS_ALL, prefill=prefill))
            cap.rows = None  # as ``Recorder.finish`` hands it over (the writer's side runs here)
            sizes.append(cap.nbytes())
            write_capture(rec, tw, cap)
    return str(tmp / name), sizes


RIDS_ALL = ["left-0", "kept", "left-2"]


def test_one_request_of_a_batch_copies_its_rows_only_and_they_are_the_full_capture_s(tmp_path):
    one, one_bytes = _record(tmp_path, "one.trace", "^kept$")
    full, full_bytes = _record(tmp_path, "full.trace", None)
    # a third of the rows on the serving thread, prefill (3 of 9 prompt tokens) and decode alike; the
    # 8 bytes besides are the target logits' k, once a capture (before: the whole batch, 3x this)
    assert [3 * (n - 8) for n in one_bytes] == [n - 8 for n in full_bytes], (one_bytes, full_bytes)
    one, full = open_trace(one), open_trace(full)
    assert [s.rid for s in one.sequences] == ["kept"]
    mine, theirs = _rows_of(one, "kept"), _rows_of(full, "kept")
    assert set(mine) == set(theirs) and {"verify.accept_index", "verify.retrieve_index", "target.aux_cat",
                                         "draft.fc_out", "draft.topk_target"} <= set(mine)
    for name, (keys, vals) in theirs.items():
        assert np.array_equal(mine[name][0], keys) and torch.equal(mine[name][1], vals), name
    assert mine["verify.accept_index"][1].tolist() == [[0, 1, 2, 3]]  # renumbered for its own block


# ---- real servers ---------------------------------------------------------------------------
def _serve(server_env, trace: Path, prompts, **env) -> str:
    """Serve ``prompts`` as one batch with rids ``RIDS``; the server's log."""
    from specdiff.tracer.engines.sglang.cpu.launch import ServerProcess, SpecSettings

    spec = SpecSettings(num_steps=3, topk=1, num_draft_tokens=4)
    srv = ServerProcess(REPO_MODELS / "target", draft_model_path=REPO_MODELS / "draft", spec=spec,
                        env=server_env(SPECDIFF_TRACE=str(trace), **env))
    with srv:
        outs = srv.post("/generate", {"input_ids": prompts, "rid": list(RIDS), "sampling_params": {
            "max_new_tokens": NEW, "temperature": 0.0, "ignore_eos": True}})
    assert [len(o["output_ids"]) for o in outs] == [NEW, NEW]
    return Path(srv.log_path).read_text(errors="replace")


@pytest.fixture(scope="module")
def traces(tmp_path_factory, run_cli, server_env):
    pytest.importorskip("sglang")
    if not (REPO_MODELS / "draft" / "config.json").exists():
        pytest.skip("the demo models are not built (traces/models)")
    tmp = tmp_path_factory.mktemp("sampled-batch")
    prompts = [p[:24] for p in demo_prompts(REPO_MODELS, 2)]
    logs = {"both": _serve(server_env, tmp / "both.trace", prompts),
            "one": _serve(server_env, tmp / "one.trace", prompts, SPECDIFF_RIDS=f"^{RIDS[0]}$")}
    return {"both": tmp / "both.trace", "one": tmp / "one.trace", "logs": logs, "tmp": tmp}


def _rows_of(trace, rid: str) -> dict:
    """name -> (keys seq-free [rows, 2] pos/depth, values) of ``rid``'s rows, in trace order."""
    sid = next(s.id for s in trace.sequences if s.rid == rid)
    out = {}
    for name in trace.names:
        k = trace.keys(name)
        mine = np.flatnonzero(k["seq"] == sid)
        if len(mine):
            vals = trace.read_torch(name)[torch.as_tensor(mine)]
            out[name] = (np.stack([k["pos"][mine], k["depth"][mine]], 1), vals)
    return out


@pytest.mark.server
def test_a_sampled_request_in_a_batch_is_recorded_alone_with_the_rows_of_a_full_trace(traces, run_cli):
    for which, log in traces["logs"].items():  # SGLang prefilled the two requests as one batch
        assert re.search(r"Prefill batch.*#new-seq: 2\b", log), (which, log[-3000:])
    one, both = open_trace(str(traces["one"])), open_trace(str(traces["both"]))
    assert [s.rid for s in one.sequences] == [RIDS[0]]
    assert {s.rid for s in both.sequences} == set(RIDS)
    assert one.contract["sampled_requests"] == {RIDS[0]: "all"}
    mine, full = _rows_of(one, RIDS[0]), _rows_of(both, RIDS[0])
    assert set(mine) == set(full) and "target.aux_cat" in mine and "verify.accept_index" in mine
    for name, (keys, vals) in full.items():
        assert np.array_equal(mine[name][0], keys), name
        assert torch.equal(mine[name][1], vals), name
    got = {s.rid: s.tokens.tolist() for s in both.sequences}
    assert one.sequences[0].tokens.tolist() == got[RIDS[0]]
    # the sampled trace is a diffable serving trace: its training side replays it, no divergence
    train = traces["tmp"] / "train.trace"
    r = run_cli("record", "train", "--target", REPO_MODELS / "target", "--draft", REPO_MODELS / "draft",
                "--replay", traces["one"], "-o", train)
    assert r.exit_code == 0, r.output
    r = run_cli("diff", train, traces["one"])
    assert r.exit_code == 0, r.output
