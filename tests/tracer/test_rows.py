"""The one row builder (tracer/rows.py), the acceptance rules (eagle3/acceptance.py) and the
background writer (tracer/engines/writer/thread.py), through the paths the recorders really run:
``specdiff record train`` and the training hooks."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from specdiff.eagle3.acceptance import AcceptTally, chain_accept, from_accept_lengths  # noqa: E402
from specdiff.tracer.engines.writer.thread import AsyncTraceWriter  # noqa: E402
from specdiff.tracer.rows import RowBatch, RowLayout, ttt_rows  # noqa: E402
from specdiff.tracer.store import TraceWriter, open_trace  # noqa: E402

torch.set_num_threads(2)
MODELS = Path(__file__).resolve().parents[2] / "traces" / "models"
demo = pytest.mark.skipif(not (MODELS / "draft" / "config.json").is_file()
                          or not (MODELS / "target" / "model.safetensors").is_file(),
                          reason="the committed demo models are not built")


# ---- record train writes exactly what the reference forward computes -----------------------
@demo
def test_record_train_rows_are_the_reference_forward_values_in_batch_order(tmp_path, run_cli):
    from specdiff.replay.model.checkpoint import load_draft
    from specdiff.replay.model.target_capture import (
        capture_target,
        load_target,
        target_embedding,
        target_lm_head,
    )
    from specdiff.replay.record.replayer import LOGITS_TOPK, TrainReplayer
    from specdiff.replay.record.sequences import TrainSequence, batches_by_length

    lines = [{"input_ids": [0, 17, 33, 51, 90, 12, 7, 300, 41, 42, 43, 44], "prompt_len": 5, "rid": "a"},
             {"input_ids": [0, 5, 6, 7, 8, 9, 10, 11], "rid": "b"},
             {"input_ids": [0, 901, 902, 903, 904, 905, 906], "rid": "c"},
             {"input_ids": [0, 5], "rid": "d"}]  # one draft row at depth 0 only
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "t.trace"
    steps, topk, probes = 3, 2, 4
    res = run_cli("record", "train", "--target", str(MODELS / "target"), "--draft", str(MODELS / "draft"),
                "--prompts", str(prompts), "-o", str(out), "--steps", str(steps), "--topk", str(topk),
                "--capture", "full", "--probe-positions", str(probes), "--batch-size", "2")
    assert res.exit_code == 0, res.output
    tr = open_trace(str(out))
    c = tr.contract

    # The same batches through the reference forward, rows written out by hand (no tracer.rows).
    target = load_target(MODELS / "target")
    loaded = load_draft(MODELS / "draft", dtype=torch.bfloat16, target_embedding=target_embedding(target).float(),
                        target_lm_head=target_lm_head(target).float())
    draft, hot = loaded.model, loaded.model.hot_token_id()
    seqs = [TrainSequence(np.asarray(x["input_ids"]), 0) for x in lines]
    want: dict[str, list] = {}

    def put(name, sid, t, d, v):
        want.setdefault(name, []).append(((sid, t, d), v))

    for idx in batches_by_length(seqs, 2, 8192):
        ids, lengths = TrainReplayer.pad([seqs[i] for i in idx])
        cap = capture_target(target, ids, c["aux_hf_indices"], lengths=lengths, keep_all=True, top_logits=LOGITS_TOPK)
        with torch.no_grad():
            o = draft.ttt_forward(cap.aux_cat, ids, steps, lengths=lengths)
        for b, i in enumerate(idx):
            for t in range(int(lengths[b])):
                for j, a in enumerate(cap.aux):
                    put(f"target.aux.{j}", i, t, 0, a[b, t])
                put("target.aux_cat", i, t, 0, cap.aux_cat[b, t])
                put("target.argmax", i, t, 0, cap.argmax[b, t])
                put("target.logits_topk.values", i, t, 0, cap.logits_top[0][b, t])
                put("target.logits_topk.ids", i, t, 0, cap.logits_top[1][b, t])
                if t < probes:
                    for h, hs in enumerate(cap.hidden_states):
                        put(f"target.probe.{h}", i, t, 0, hs[b, t])
                put("draft.fc_in", i, t, 0, o.fc_in[b, t])
                put("draft.fc_out", i, t, 0, o.fc_out[b, t])
        for d in range(steps):
            for b, i in enumerate(idx):
                for t in range(int(lengths[b]) - 1 - d):  # t + 1 + k < length
                    for name, x in (("tokens", o.tokens), ("draft.hidden_in", o.hidden_in),
                                    ("draft.positions", o.positions), ("draft.attn_in", o.attn_in),
                                    ("draft.hidden_out", o.hidden_out), ("draft.logits", o.logits)):
                        put(name, i, t, d, x[d][b, t])
                    if d:  # what the forward embedded at depth d >= 1
                        put("draft.input_ids", i, t, d, o.tokens[d][b, t])
    assert set(want) | {"draft.topk", "draft.topk_target", "draft.accept", "draft.accept_cum", "draft.d2t"} \
        == set(tr.names)
    # keys and order: batch by batch, depth by depth, row b then position t
    for name, rows in want.items():
        k = tr.keys(name)
        got_keys = list(zip(k["seq"].tolist(), k["pos"].tolist(), k["depth"].tolist(), strict=True))
        assert got_keys == [key for key, _ in rows], name
        exp = torch.stack([v for _, v in rows])
        assert tr.info(name).dtype == str(exp.dtype).removeprefix("torch."), name
        vals = tr.read(name, as_float32=exp.is_floating_point())
        exp = exp.float().numpy() if exp.is_floating_point() else exp.numpy()
        np.testing.assert_array_equal(vals.reshape(exp.shape), exp, err_msg=name)
    # draft.topk: descending draft-vocab ids of the logits; topk_target through hot_token_id
    tk, tkt = tr.read("draft.topk"), tr.read("draft.topk_target")
    lg = tr.read("draft.logits", as_float32=True)
    assert tk.shape[1] == topk
    top = np.take_along_axis(lg, tk, axis=1)
    np.testing.assert_array_equal(top[:, 0], lg.max(axis=1))
    assert (top[:, 0] >= top[:, 1]).all()
    np.testing.assert_array_equal(tkt, hot.numpy()[tk])
    # accept at (t, k): mapped top-1 == target argmax at t+1+k; cum: every depth <= k
    km = tr.keys("target.argmax")
    am = dict(zip(zip(km["seq"].tolist(), km["pos"].tolist()), tr.read("target.argmax").tolist(), strict=True))
    ka = tr.keys("draft.accept")
    acc, cum = tr.read("draft.accept"), tr.read("draft.accept_cum")
    by_key = {}
    for r, (s, p, d) in enumerate(zip(ka["seq"].tolist(), ka["pos"].tolist(), ka["depth"].tolist(), strict=True)):
        assert bool(acc[r]) == (int(tkt[r, 0]) == am[(s, p + 1 + d)])
        by_key[(s, p, d)] = bool(acc[r])
        assert bool(cum[r]) == all(by_key[(s, p, e)] for e in range(d + 1))
    # the contract's acceptance: eagle3.acceptance over the rows just checked
    per_depth = [float(cum[ka["depth"] == d].mean()) for d in range(steps)]
    assert c["accept_cum_rate"] == pytest.approx(per_depth, abs=0)
    full = {(s, p) for (s, p, d) in by_key if d == steps - 1}
    chain = [np.mean([by_key[(s, p, d)] and all(by_key[(s, p, e)] for e in range(d)) for (s, p) in full])
             for d in range(steps)]
    assert c["mean_accept_length"] == pytest.approx(1 + sum(chain), rel=1e-12)


# ---- the background writer: lossless mode (record train) ------------------------------------
class _Rows:
    def __init__(self, n):
        self.n = n


def _append(tw, item):
    tw.append("verify.accept_length", np.array([item.n]), seq=0, pos=item.n)


def test_lossless_writer_waits_instead_of_dropping_and_reports_progress(tmp_path):
    gate = threading.Event()
    seen = []

    def slow(tw, item):
        gate.wait(5)
        _append(tw, item)

    aw = AsyncTraceWriter(TraceWriter(str(tmp_path / "a.trace"), side="train"), slow, max_items=1, lossless=True,
                          on_written=lambda item: seen.append(item.n))
    t = threading.Thread(target=lambda: [aw.submit(_Rows(i)) for i in range(5)])
    t.start()
    t.join(0.3)
    assert t.is_alive() and aw.dropped == 0  # the queue is full: submit waits
    gate.set()
    t.join(5)
    assert aw.close(timeout_s=None, contract={"accept_rate": [0.5]})
    tr = open_trace(str(tmp_path / "a.trace"))
    assert tr.closed and tr.read("verify.accept_length").tolist() == [0, 1, 2, 3, 4] and seen == [0, 1, 2, 3, 4]
    assert tr.contract["accept_rate"] == [0.5] and "dropped_records" not in tr.contract


def test_a_write_error_in_record_train_reaches_the_caller_and_the_trace_keeps_what_was_written(tmp_path):
    def failing(tw, item):
        if item.n == 2:
            raise OSError("No space left on device")
        _append(tw, item)

    aw = AsyncTraceWriter(TraceWriter(str(tmp_path / "b.trace"), side="train"), failing, max_items=1, lossless=True)
    with pytest.raises(OSError, match="No space left"):
        for i in range(50):  # a later submit, or close, raises the thread's error
            aw.submit(_Rows(i))
        aw.close(timeout_s=None)
    with pytest.raises(OSError, match="No space left"):  # close after a failed submit raises it too
        aw.close(timeout_s=None, contract={"accept_rate": [1.0]}) or aw._raise()
    tr = open_trace(str(tmp_path / "b.trace"))
    assert tr.closed and tr.read("verify.accept_length").tolist() == [0, 1]
    assert "accept_rate" not in tr.contract  # no summary of a trace that is incomplete


def test_record_train_raises_the_writer_error_and_closes_the_trace(tmp_path, monkeypatch):
    from specdiff.replay.record.record_train import record_train
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"input_ids": [0, 17, 33, 51, 90, 12, 7], "rid": "a"}) + "\n")
    append = TraceWriter.append

    def full_disk(self, name, *a, **kw):
        if name == "draft.attn_in":
            raise OSError("No space left on device")
        return append(self, name, *a, **kw)

    monkeypatch.setattr(TraceWriter, "append", full_disk)
    with pytest.raises(OSError, match="No space left"):
        record_train(MODELS / "target", MODELS / "draft", str(tmp_path / "t.trace"), prompts=prompts,
                     probe_positions=0, steps=2)
    tr = open_trace(str(tmp_path / "t.trace"))
    assert tr.closed and [s.rid for s in tr.sequences] == ["a"] and "mean_accept_length" not in tr.contract


# ---- the training hooks and record train agree --------------------------------------------
def _tied_draft():
    """A bf16 draft whose top-2 draft logits tie in every row: lm_head rows 3 and 7 are v, the
    others -v/2, so ids 3 and 7 lead tied (or, where v.x < 0, the other 14 do)."""
    from specdiff.eagle3.norms import NORMS_OFF
    from specdiff.replay.model.draft_model import Eagle3Draft, Eagle3DraftConfig

    cfg = Eagle3DraftConfig(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                            head_dim=8, vocab_size=64, draft_vocab_size=16, target_hidden_size=32, num_aux=3,
                            rms_norm_eps=1e-6, rope_theta=10000.0, rope_scaling=None, **NORMS_OFF)
    d = Eagle3Draft(cfg)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
        v = d.lm_head.weight[3].clone()
        d.lm_head.weight[:] = -0.5 * v
        d.lm_head.weight[3] = d.lm_head.weight[7] = v
        d.d2t.copy_(torch.arange(16) * 3)
    return d.to(torch.bfloat16)


@pytest.mark.parametrize("logits", ["topk", "none"])
def test_hooks_and_record_train_break_tied_draft_logits_alike(tmp_path, logits):
    """torch.topk orders tied logits by an order that depends on k: the hooks took draft.topk
    with k = topk, record train the first topk of a top-8, so on tied logits the two recorders
    wrote different ids (seen on the demo draft: [96, 34] vs [34, 96])."""
    from specdiff.tracer.training_hooks import attach_recorder
    draft = _tied_draft()
    g = torch.Generator().manual_seed(4)
    aux, ids = torch.randn(2, 7, 96, generator=g).bfloat16(), torch.randint(0, 64, (2, 7), generator=g)
    lengths = torch.tensor([7, 5])
    w = TraceWriter(str(tmp_path / "h.trace"), side="train")
    rec = attach_recorder(draft, w, topk=2, logits=logits, logits_topk=4)
    rec.batch([0, 1], lengths, tokens=ids, target_argmax=ids)
    with torch.no_grad():
        out = draft.ttt_forward(aux, ids, 2, lengths=lengths)
    rec.detach()
    w.close()
    batch = RowBatch()
    ttt_rows(batch, RowLayout.padded([0, 1], lengths), out, topk=2, hot_token_id=draft.hot_token_id(), argmax=ids)
    want = batch.collected()
    tr = open_trace(str(tmp_path / "h.trace"))
    top = np.take_along_axis(torch.cat([lg[v] for lg, v in zip(out.logits, out.valid, strict=True)]).float().numpy(),
                             tr.read("draft.topk"), axis=1)
    assert (top[:, 0] == top[:, 1]).all()  # every row's top-2 is a tie
    for name in ("draft.topk", "draft.topk_target", "draft.accept", "draft.accept_cum"):
        np.testing.assert_array_equal(tr.read(name), want[name][0].numpy(), err_msg=name)
        np.testing.assert_array_equal(tr.keys(name)["pos"], want[name][2], err_msg=name)


def test_packed_batches_get_per_sequence_keys_and_pairing(tmp_path):
    from specdiff.tracer.training_hooks import attach_recorder
    draft = _tied_draft()
    lengths = torch.tensor([5, 4])
    ids = torch.arange(1, 10)[None]  # two sequences back to back: [1..5] and [6..9]
    aux = torch.randn(1, 9, 96).bfloat16()
    w = TraceWriter(str(tmp_path / "p.trace"), side="train")
    rec = attach_recorder(draft, w, logits="none")
    rec.batch([10, 11], lengths, packed=True, tokens=ids)
    with torch.no_grad():
        draft.ttt_forward(aux, ids, 3)
    rec.detach()
    w.close()
    tr = open_trace(str(tmp_path / "p.trace"))
    k = tr.keys("tokens")
    keys = list(zip(k["seq"].tolist(), k["pos"].tolist(), k["depth"].tolist(), strict=True))
    # t + 1 + k < length of each sequence: no row reads across the boundary
    assert keys == [(s, t, d) for d in range(3) for s, n in ((10, 5), (11, 4)) for t in range(n - 1 - d)]
    toks = {10: [1, 2, 3, 4, 5], 11: [6, 7, 8, 9]}
    assert tr.read("tokens").tolist() == [toks[s][t + 1 + d] for s, t, d in keys]  # x_{t+1+k}
    assert tr.keys("draft.fc_out")["pos"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2, 3]


# ---- the acceptance rules ------------------------------------------------------------------
def test_serving_acceptance_counts_the_bonus_token():
    # accept_lens = accepted drafts + 1 (SGLang eagle_utils.py:845): 0, 1 and 3 drafts accepted
    st = from_accept_lengths([1, 2, 4], 3)
    assert st.mean_accept_length == pytest.approx(7 / 3) and st.samples == 3
    assert st.per_depth == pytest.approx((2 / 3, 1 / 3, 1 / 3))


def test_chain_acceptance_stops_at_the_first_rejected_depth():
    acc0, cum0 = chain_accept(np.array([5, 6, 7]), np.array([5, 0, 7]))
    acc1, cum1 = chain_accept(np.array([1, 1, 2]), np.array([1, 1, 0]), cum0)
    assert acc1.tolist() == [True, True, False] and cum1.tolist() == [True, False, False]
    t = AcceptTally(3)
    t.add(0, cum0)
    t.add(1, cum1, np.array([True, True, False]))  # the third row has no depth-1 row
    assert t.per_depth() == (2 / 3, 0.5, 0.0) and t.mean_accept_length() == 1 + 2 / 3 + 0.5
    assert t.stats().samples == 3


def test_row_batch_keys_mix_scalars_and_arrays_and_land_in_the_store(tmp_path):
    """RowBatch keeps each piece's keys as given (int, [n] or [1]) and builds one column per name at
    flush: the rows a real TraceWriter stores carry exactly those keys, in the order added."""
    out = RowBatch()
    out.add("target.argmax", torch.tensor([5, 6, 7]), seq=1, pos=np.arange(3), depth=0, iter=4)
    out.add("target.argmax", torch.tensor([8]), seq=np.array([2]), pos=9, depth=np.int16(0), iter=np.array([5]))
    out.add("target.argmax", torch.tensor([9, 10]), seq=torch.tensor([3, 3]), pos=[1, 2], depth=0, iter=-1)
    tw = TraceWriter(str(tmp_path / "t.trace"), side="serve", contract={})
    out.flush(tw)
    assert out.parts == {}
    tw.close()
    t = open_trace(str(tmp_path / "t.trace"))
    k = t.keys("target.argmax")
    assert k["seq"].tolist() == [1, 1, 1, 2, 3, 3]
    assert k["pos"].tolist() == [0, 1, 2, 9, 1, 2]
    assert k["iter"].tolist() == [4, 4, 4, 5, -1, -1]
    assert t.read("target.argmax").tolist() == [5, 6, 7, 8, 9, 10]


def test_row_batch_refuses_a_key_of_another_length():
    with pytest.raises(ValueError, match="for 3 rows"):
        RowBatch().add("target.argmax", torch.tensor([5, 6, 7]), seq=0, pos=np.arange(2))


def test_trace_writer_owns_its_key_columns(tmp_path):
    """A caller's key array changed after append does not change the rows' keys."""
    tw = TraceWriter(str(tmp_path / "t.trace"), side="serve", contract={})
    pos = np.arange(3)
    tw.append("target.argmax", torch.tensor([1, 2, 3]), seq=0, pos=pos)
    pos[:] = 7
    tw.close()
    assert open_trace(str(tmp_path / "t.trace")).keys("target.argmax")["pos"].tolist() == [0, 1, 2]
