"""The vLLM recorder's hot path and row attribution (vLLM 0.32.0, V1 model runner, EAGLE-3 chain).

One recorded iteration is one ``GPUModelRunner.sample_tokens`` call (v1/worker/gpu_model_runner.py:4304):
``_sample`` verifies the previous step's drafts (or samples a prefill's first token), then
``propose_draft_token_ids`` builds the aux concat and calls ``SpecDecodeBaseProposer.propose``,
which runs the draft's first pass over every target row and K-1 more steps from each request's
sampled row. The wrappers (plugin.py) and the draft's module hooks copy tensors into an
``IterCapture``; the writer (process, or thread) attributes rows (EAGLE-3 pairing, tracer/schema.py):

- target rows of request b span ``query_start_loc[b]:query_start_loc[b+1]`` at ``target_positions``.
  Prefill (no drafts verified): every row, iter -1. Verify (K drafts): the root (previous bonus)
  sits at L = its first position; v = valid sampled tokens (accepted drafts + bonus): the target
  rows at L..L+v-1 are the accepted ones; ``verify.*`` rows are keyed pos = L.
- the draft's first pass is depth 0: row t consumes (h_t, x_{t+1}) (the input ids are the
  target's shifted by one, the sampled token at the sample row: llm_base_proposer.py:817-956);
  only the valid rows L..L+v-1 are attributed (the rest are rejected drafts' rows). Logits
  exist at the sample row only (``token_indices_to_sample``).
- step k (1..K-1) is depth k at the sample row's position p: the input token is the draft of
  depth k-1 (target id), positions p + k (:737-741 via ``_update_positions_dependent_metadata``).
- ``draft.topk_target`` at depth k is ``propose``'s draft token k (target ids after the d2t
  scatter); ``draft.topk`` the argmax over the draft vocab (the logits processor's output).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specdiff.tracer.contract import known
from specdiff.tracer.engines import target_logits
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.recorder import ServingRecorder, add_aux
from specdiff.tracer.engines.requests import sequence_id
from specdiff.tracer.engines.vllm.adapter import VLLMAdapter
from specdiff.tracer.rows import RowBatch

logger = logging.getLogger("specdiff.tracer")


@dataclass
class DraftForward:
    """One call of the draft model (outer ``Eagle3LlamaForCausalLM.forward``, outside the compiled graph)."""

    input_ids: Any
    positions: Any
    hidden_in: Any
    hidden_out: Any  # pre-norm midlayer output [rows, Hd] (None when norm_output)


@dataclass
class DraftLogits:
    """One ``compute_logits`` of the draft, reduced: draft-vocab top-k, logsumexp, argmax."""

    values: Any
    ids: Any
    lse: Any
    argmax: Any
    full: Any = None


@dataclass
class IterCapture:
    """Everything recorded in one ``sample_tokens`` call (host copies)."""

    iter: int
    rids: list[str]
    prompts: dict[str, Any] = field(default_factory=dict)  # rid -> prompt ids as vLLM holds them (list)
    reasons: dict[str, str] = field(default_factory=dict)  # rids first recorded here -> why (requests.py)
    t: dict[str, Any] = field(default_factory=dict)
    num_draft: list[int] | None = None
    fc: list[tuple] = field(default_factory=list)
    forwards: list[DraftForward] = field(default_factory=list)
    logits: list[DraftLogits] = field(default_factory=list)

    def wait(self) -> None:
        return None

    def nbytes(self) -> int:
        def size(v):
            return v.nbytes if isinstance(v, torch.Tensor) else 0

        n = sum(size(v) for v in self.t.values())
        n += sum(size(a) + size(b) for a, b in self.fc)
        n += sum(sum(size(v) for v in vars(f).values()) for f in self.forwards)
        n += sum(sum(size(v) for v in vars(lg).values()) for lg in self.logits)
        return n


class Recorder(ServingRecorder):
    """Process-wide recorder state (the process that runs the V1 model runner, TP rank 0)."""

    HANDLER = "specdiff.tracer.engines.vllm.hooks:write_capture"
    ASYNC_D2H = False  # a synchronous copy off a GPU: the V1 runner reuses its buffers within the step

    def __init__(self, opts: Options, adapter: VLLMAdapter):
        super().__init__(opts, adapter)
        self._hooked: set[int] = set()
        self.loads: dict = {}  # id(model) -> tracer.weight_facts.LoadWatch (plugin._wrap_loader)

    def start(self, runner) -> None:
        """Read the contract from the live runner, open the trace, hook the draft (once)."""
        with self._lock:
            if self.writer is not None or not self.enabled:
                return
            from specdiff.tracer.engines.vllm.contract import (
                contract_from_runner,
                read_chain,
                unrecorded_stages,
            )

            c = contract_from_runner(runner, self.opts, self.adapter)
            c.update(self._live_facts(runner))
            c["unrecorded_stages"] = unrecorded_stages(self.opts, c)
            c["unobservable"] = self.adapter.unobservable()
            self.adopt(c)
            first = []
            dmodel = read_chain(self.adapter, runner, "GPUModelRunner.drafter", "SpecDecodeBaseProposer.model")
            if hasattr(dmodel, "unwrap"):
                dmodel = dmodel.unwrap()
            d2t = read_chain(self.adapter, dmodel, "Eagle3LlamaForCausalLM.draft_id_to_target_id")
            vd = known(c, "draft_vocab_size")
            if d2t is not MISSING and (d2t is not None or isinstance(vd, int)):
                d = (torch.zeros(vd, dtype=torch.int64) if d2t is None else d2t.detach().to("cpu", torch.int64))
                first.append(("draft.d2t", d, -1, np.arange(d.numel())))
            if dmodel is not MISSING:
                self.hook_draft(dmodel)
            self.open(c, first, side={"hidden_size": self.hidden_size, "num_aux": self.num_aux})
            logger.info("specdiff: recording an EAGLE-3 trace to %s (vLLM %s, %s)", self.opts.path,
                        self.adapter.version, c["engine_runner"])

    def _live_facts(self, runner) -> dict:
        """tracer/engines/vllm/live_facts.py's facts of the live runner and its target and draft models."""
        from specdiff.tracer.engines.vllm.contract import read_chain
        from specdiff.tracer.engines.vllm.live_facts import live_facts

        A = self.adapter
        models = [read_chain(A, runner, "GPUModelRunner.model"),
                  read_chain(A, runner, "GPUModelRunner.drafter", "SpecDecodeBaseProposer.model")]
        tmodel, dmodel = (m.unwrap() if hasattr(m, "unwrap") else m for m in models)
        facts = live_facts(runner, A, self.loads, tmodel=tmodel, dmodel=dmodel)
        self.loads.clear()
        return facts

    def record_crash(self, exc: BaseException) -> None:
        """vLLM raised inside a recorded iteration: write the crash into the trace and close it."""
        from specdiff.tracer.crash import crash_record, describe_crash

        cap = self.cur
        forward, shapes = self.phase if self.phase is not None else (None, {})
        crash = crash_record(exc, forward=forward, forward_shapes=shapes,
                             iteration=None if cap is None else cap.iter,
                             kind=None if cap is None else ("decode" if cap.num_draft and any(cap.num_draft)
                                                            else "prefill"),
                             rids=() if cap is None else cap.rids, prompts=None if cap is None else cap.prompts)
        logger.error("specdiff: vLLM raised %s; the trace %s keeps the contract and this crash",
                     describe_crash(crash), self.opts.path)
        self.close(crash=crash)

    # -- hot path --
    def begin(self, runner) -> IterCapture | None:
        A = self.adapter
        batch = A.get(runner, "GPUModelRunner.input_batch")
        rids = [] if batch is MISSING else A.get(batch, "InputBatch.req_ids")
        if rids is MISSING or not rids:
            return None  # warm-up / profile runs schedule no request
        rids = [str(r) for r in rids]
        new = self.choose(rids)  # vLLM 0.32 keeps no client field the recorder reads: fraction and rid only
        if not new and not any(self.keep_rid(r) for r in rids):
            return None
        cap = IterCapture(iter=self._iter, rids=rids, reasons=new)
        self._iter += 1
        reqs = A.get(runner, "GPUModelRunner.requests")
        if reqs is not MISSING:
            for rid in rids:  # recorded requests only; the writer makes ints of the prompt
                if rid in reqs:
                    self.note_prompt(cap, rid, lambda rid=rid: A.get(reqs[rid], "CachedRequestState.prompt_token_ids"))
        self.cur = cap  # snap copies into the writer's ring on the capture's behalf
        return cap

    def on_sample(self, cap: IterCapture, logits, spec_meta, out) -> None:
        A = self.adapter
        sampled = A.get(out, "SamplerOutput.sampled_token_ids")
        if sampled is not MISSING:
            cap.t["sampled"] = self.snap(sampled, dtype=torch.int64)
        if logits is not None:
            cap.t["target_argmax"] = self.snap(logits.argmax(dim=-1), dtype=torch.int64)
            target_logits.stage(self, cap.t, logits, self.opts.logits_topk)
        if spec_meta is not None:
            nd = A.get(spec_meta, "SpecDecodeMetadata.num_draft_tokens")
            cap.num_draft = None if nd is MISSING else [int(x) for x in nd]
            dt = A.get(spec_meta, "SpecDecodeMetadata.draft_token_ids")
            if dt is not MISSING:
                cap.t["verified_drafts"] = self.snap(dt, dtype=torch.int64)
        else:
            cap.num_draft = [0] * len(cap.rids)

    def on_propose(self, cap: IterCapture, kw: dict) -> None:
        A = self.adapter
        cad = kw["common_attn_metadata"]
        qsl = A.get(cad, "CommonAttentionMetadata.query_start_loc_cpu")
        if qsl is MISSING:
            return
        qsl = self.snap(qsl, dtype=torch.int64)
        cap.t["qsl"] = qsl
        n = int(qsl[-1])
        cap.t["aux_cat"] = self.snap(kw["target_hidden_states"][:n])
        cap.t["target_ids"] = self.snap(kw["target_token_ids"][:n], dtype=torch.int64)
        pos = kw["target_positions"]
        cap.t["target_pos"] = self.snap(pos[..., :n] if pos.dim() == 1 else pos[0, :n], dtype=torch.int64)
        cap.t["next_ids"] = self.snap(kw["next_token_ids"], dtype=torch.int64)
        tis = kw.get("token_indices_to_sample")
        cap.t["sample_rows"] = (qsl[1:] - 1) if tis is None else self.snap(tis, dtype=torch.int64)

    def hook_draft(self, dmodel) -> None:
        """Forward hooks on the draft's modules that run eagerly: fc (in combine_hidden_states),
        the outer forward (inputs / outputs of the compiled LlamaModel) and the logits processor."""
        if id(dmodel) in self._hooked:
            return
        self._hooked.add(id(dmodel))
        A = self.adapter
        inner = A.get(dmodel, "Eagle3LlamaForCausalLM.model")
        fc = MISSING if inner is MISSING else A.get(inner, "LlamaModel.fc")
        lp = A.get(dmodel, "Eagle3LlamaForCausalLM.logits_processor")
        norm_output = False if inner is MISSING else bool(getattr(inner, "norm_output", False))
        rec = self

        def timed(fn):
            # the module hooks' own time counts in recorder_hook_s (the serving cost)
            def hook(*a):
                t0 = time.perf_counter()
                try:
                    return fn(*a)
                finally:
                    rec.hook_s += time.perf_counter() - t0
            return hook

        def _cap():
            c = rec.cur
            return c if c is not None and rec.enabled else None

        def _fc(_m, inp, out):
            cap = _cap()
            if cap is None:
                return
            try:
                o = out[0] if isinstance(out, tuple) else out
                cap.fc.append((rec.snap(inp[0]), rec.snap(o)))
            except Exception as exc:  # noqa: BLE001
                rec.fail("draft fc", exc)

        def _fwd(_m, args, kwargs, out):
            cap = _cap()
            if cap is None:
                return
            try:
                names = ("input_ids", "positions", "hidden_states")
                got = {k: kwargs.get(k, args[i] if i < len(args) else None) for i, k in enumerate(names)}
                h, pre = out if isinstance(out, tuple) else (out, None)
                cap.forwards.append(DraftForward(
                    input_ids=rec.snap(got["input_ids"]), positions=rec.snap(got["positions"]),
                    hidden_in=rec.snap(got["hidden_states"]), hidden_out=None if norm_output else rec.snap(pre)))
            except Exception as exc:  # noqa: BLE001
                rec.fail("draft forward", exc)

        def _logits(_m, _args, out):
            cap = _cap()
            if cap is None or out is None:
                return
            try:
                lf = out.detach()
                k = min(rec.opts.logits_topk, lf.shape[-1])
                vals, ids = torch.topk(lf, k, dim=-1)
                cap.logits.append(DraftLogits(values=rec.snap(vals), ids=rec.snap(ids),
                                              lse=rec.snap(torch.logsumexp(lf.float(), dim=-1)),
                                              argmax=rec.snap(lf.argmax(dim=-1)),
                                              full=rec.snap(lf) if rec.opts.capture == "full" else None))
            except Exception as exc:  # noqa: BLE001
                rec.fail("draft logits", exc)

        if isinstance(fc, torch.nn.Module):
            fc.register_forward_hook(timed(_fc))
        dmodel.register_forward_hook(timed(_fwd), with_kwargs=True)
        if isinstance(lp, torch.nn.Module):
            lp.register_forward_hook(timed(_logits))

    def finish(self, cap: IterCapture, draft_ids) -> None:
        if draft_ids is not None and isinstance(draft_ids, torch.Tensor):
            cap.t["draft_ids"] = self.snap(draft_ids, cap, torch.int64)
        self.sync_unobservable()
        self.writer.submit(cap)


# ---- attribution (the writer) --------------------------------------------------------------


def _add_forward(out: RowBatch, f: DraftForward, sel, seq, pos, depth, it, *, tokens=True) -> None:
    if tokens and f.input_ids is not None:
        out.add("tokens", f.input_ids[sel].to(torch.int64), seq=seq, pos=pos, depth=depth, iter=it)
    if depth and f.input_ids is not None:  # what the step was fed (schema draft.input_ids)
        out.add("draft.input_ids", f.input_ids[sel].to(torch.int64), seq=seq, pos=pos, depth=depth, iter=it)
    if f.positions is not None and f.positions.dim() == 1:
        out.add("draft.positions", f.positions[sel].to(torch.int64), seq=seq, pos=pos, depth=depth, iter=it)
    if f.hidden_in is not None:
        out.add("draft.hidden_in", f.hidden_in[sel], seq=seq, pos=pos, depth=depth, iter=it)
    if f.hidden_out is not None:
        out.add("draft.hidden_out", f.hidden_out[sel], seq=seq, pos=pos, depth=depth, iter=it)


def _add_logits(out: RowBatch, lg: DraftLogits, b: int, seq, pos, depth, it, draft_ids) -> None:
    sel = slice(b, b + 1)
    out.add("draft.logits_topk.values", lg.values[sel], seq=seq, pos=pos, depth=depth, iter=it)
    out.add("draft.logits_topk.ids", lg.ids[sel].to(torch.int64), seq=seq, pos=pos, depth=depth, iter=it)
    out.add("draft.logsumexp", lg.lse[sel], seq=seq, pos=pos, depth=depth, iter=it)
    out.add("draft.topk", lg.argmax[sel].to(torch.int64)[:, None], seq=seq, pos=pos, depth=depth, iter=it)
    if lg.full is not None:
        out.add("draft.logits", lg.full[sel], seq=seq, pos=pos, depth=depth, iter=it)
    if draft_ids is not None and depth < draft_ids.shape[1]:
        out.add("draft.topk_target", draft_ids[sel, depth:depth + 1], seq=seq, pos=pos, depth=depth, iter=it)


def write_capture(rec: Recorder, tw, cap: IterCapture) -> None:
    """Attribute one iteration's tensors (see the module docstring) and append them."""
    t = cap.t
    qsl, sampled = t.get("qsl"), t.get("sampled")
    if sampled is None:
        return
    out = RowBatch()
    touched: set[str] = set()
    nd = cap.num_draft or [0] * len(cap.rids)
    aux, tpos, tids = t.get("aux_cat"), t.get("target_pos"), t.get("target_ids")
    rows_s = t.get("sample_rows")
    draft_ids = t.get("draft_ids")
    argmax = t.get("target_argmax")
    fc_in, fc_out = cap.fc[0] if cap.fc else (None, None)
    f0 = cap.forwards[0] if cap.forwards else None
    steps = cap.forwards[1:]
    top = target_logits.top(t)
    if top is not None and argmax is not None and top[0].shape[0] != argmax.shape[0]:
        top = None
    lofs = 0  # target logits rows: K+1 per verified request, 1 per other (gpu_model_runner.py _calc_spec_decode_metadata)
    for b, rid in enumerate(cap.rids):
        k_b = nd[b] if b < len(nd) else 0
        nlog = k_b + 1
        pred = None if argmax is None else argmax[lofs:lofs + nlog]
        row0 = lofs
        lofs += nlog
        if not rec.keep_rid(rid):
            continue
        sid = sequence_id(rec, tw, rid, cap.prompts.get(rid))
        toks = rec.seq_tokens[rid]
        srow = sampled[b]
        valid = srow[srow >= 0]
        if qsl is None or tpos is None:
            continue
        qs, qe = int(qsl[b]), int(qsl[b + 1])
        pos = tpos[qs:qe].numpy()
        if len(pos) == 0:
            continue
        P0 = int(pos[0])
        if k_b == 0:  # prefill chunk: every row
            it, nvalid = -1, qe - qs
            final = P0 + nvalid >= rec.seq_prompt[rid]
            if aux is not None:
                add_aux(rec, out, aux[qs:qe], sid, pos, it)
            last = int(pos[-1])
            if final and len(valid):
                out.add("target.argmax", valid[:1], seq=sid, pos=last, depth=0, iter=it)
                target_logits.add_rows(out, top, row0, seq=sid, pos=last, it=it)
                if len(toks) == last + 1:
                    toks.append(int(valid[0]))
                    touched.add(rid)
        else:  # verify of k_b drafts: root at L
            it, L, nvalid = cap.iter, P0, int(len(valid))
            slots = srow.shape[0]
            out.add("verify.accept_length", torch.tensor([nvalid]), seq=sid, pos=L, depth=0, iter=it)
            out.add("verify.accepted_tokens", srow[None], seq=sid, pos=L, depth=0, iter=it)
            aidx = torch.full((slots,), -1, dtype=torch.int64)
            aidx[:nvalid] = torch.arange(nvalid)
            out.add("verify.accept_index", aidx[None], seq=sid, pos=L, depth=0, iter=it)
            if tids is not None:
                out.add("verify.draft_tokens", tids[qs:qe][None], seq=sid, pos=L, depth=0, iter=it)
            if pred is not None and len(pred) == nlog:
                out.add("verify.predict", pred[None], seq=sid, pos=L, depth=0, iter=it)
                out.add("target.argmax", pred[:nvalid], seq=sid, pos=pos[:nvalid], depth=0, iter=it)
                target_logits.add_rows(out, top, slice(row0, row0 + nvalid), seq=sid, pos=pos[:nvalid], it=it)
            if aux is not None:
                add_aux(rec, out, aux[qs:qs + nvalid], sid, pos[:nvalid], it)
            if len(toks) == L + 1:
                toks.extend(int(x) for x in valid)
                touched.add(rid)
        # draft depth 0: the first pass's valid rows
        sel = slice(qs, qs + nvalid)
        dpos = pos[:nvalid]
        if f0 is not None and f0.input_ids is not None and f0.input_ids.shape[0] >= qe:
            _add_forward(out, f0, sel, sid, dpos, 0, it)
            if fc_out is not None and fc_out.shape[0] >= qe:
                out.add("draft.fc_in", fc_in[sel], seq=sid, pos=dpos, depth=0, iter=it)
                out.add("draft.fc_out", fc_out[sel], seq=sid, pos=dpos, depth=0, iter=it)
        if rows_s is None or int(rows_s[b]) != qs + nvalid - 1:
            continue  # a prefill chunk that is not the last samples nothing the draft continues from
        p = int(dpos[-1])
        for d, lg in enumerate(cap.logits):
            if b < lg.values.shape[0]:
                _add_logits(out, lg, b, sid, p, d, it, draft_ids)
        for d, f in enumerate(steps, start=1):
            if f.input_ids is not None and b < f.input_ids.shape[0]:
                _add_forward(out, f, slice(b, b + 1), sid, p, d, it)
    for rid in touched:
        tw.add_sequence(np.asarray(rec.seq_tokens[rid], np.int32), prompt_len=rec.seq_prompt[rid], rid=rid,
                        seq_id=rec.seq_ids[rid])
    out.flush(tw)
