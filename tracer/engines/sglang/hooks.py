"""Hook functions and row attribution of the SGLang EAGLE-3 recorder (SGLang 0.5.23, worker v2).

Hot path (in the scheduler's forward): hooks only copy tensors (``ServingRecorder.snap``: on CPU
once, into the writer process's ring; on CUDA with ``non_blocking=True`` into pinned host memory),
reduce the draft logits (top-k, logsumexp) on the device on a GPU (on a CPU the logits are staged
and the writer reduces them: ``attribution.reduce_logits``), and collect them
in an ``IterCapture`` for the current ``EAGLEWorkerV2.forward_batch_generation`` call; requests
that are not sampled cost a dict lookup, and in a batch that also holds them only the sampled
requests' rows are copied (``Recorder.snap``, ``row_select``). At the end of that call the capture (plus a CUDA event)
goes to the writer; ``write_capture`` runs there (the writer process), after the event, and
attributes rows to ``(seq, pos, depth, iter)`` (tracer/schema.py).

Options come from the environment (``options``), the contract facts from the live
objects at start-up (``contract``), and the writer (process, or thread) attributes rows
(``attribution``).
"""

from __future__ import annotations

import logging

import torch

from specdiff.tracer.contract import UNKNOWN, known
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.options import Options
from specdiff.tracer.engines.recorder import ServingRecorder
from specdiff.tracer.engines.sglang.adapter import SGLangAdapter
from specdiff.tracer.engines.sglang.attribution import DraftForward, IterCapture, reduce_logits
from specdiff.tracer.engines.sglang.contract import (
    aux_capture_facts,
    contract_from_worker,
    graph_hidden_stages,
    hot_token_id,
    unrecorded_stages,
)
from specdiff.tracer.engines.sglang.draft_stages import DraftStageTaps, graph_hidden
from specdiff.tracer.engines.sglang.live_facts import live_facts
from specdiff.tracer.engines.sglang.prefill import PrefillFacts
from specdiff.tracer.engines.sglang.reading import read_chain
from specdiff.tracer.engines.sglang.row_select import RowSelection

logger = logging.getLogger("specdiff.tracer")


#: read once: ``torch.cuda.is_available()`` reads the environment on every call, and every hook
#: asks ``_capturing`` (0.8 % of the CPU server's serving thread, profiled); a process does not
#: gain or lose its CUDA devices while it serves
_CUDA = torch.cuda.is_available()


def _capturing() -> bool:
    return _CUDA and torch.cuda.is_current_stream_capturing()


# ---- the recorder ---------------------------------------------------------------------------
class Recorder(ServingRecorder):
    """Process-wide recorder state (one per scheduler process, TP rank 0)."""

    HANDLER = "specdiff.tracer.engines.sglang.attribution:write_capture"

    def __init__(self, opts: Options, adapter: SGLangAdapter | None = None):
        super().__init__(opts, adapter if adapter is not None else SGLangAdapter.for_running())
        self.in_iteration = False  # inside EAGLEWorkerV2.forward_batch_generation
        self.fc_sink: list | None = None
        self.topk: int = 1
        self._hooked_models: set[int] = set()
        self.stage_taps = DraftStageTaps(snap=self.snap, capturing=_capturing, on_error=self.fail)
        self.prefill = PrefillFacts()  # per-request cached prefix and chunks (contract request_prefill)
        self.loads: dict = {}  # id(model) -> tracer.weight_facts.LoadWatch (plugin._around_load_weights)

    def start(self, draft_worker) -> None:
        """Build the contract from the live ``EagleDraftWorker`` and open the trace (once).

        Called after ``EagleDraftWorker.alloc_memory_pool`` (start-up, before any request), or
        at the first iteration when that hook did not run.
        """
        with self._lock:
            if self.writer is not None or not self.enabled:
                return
            self.contract = contract_from_worker(draft_worker, self.opts, self.adapter)
            self.contract.update(live_facts(draft_worker, self.adapter, self.loads, weights=self.opts.weight_facts))
            self.loads.clear()
            # Hooks on the draft's midlayer now, so the contract says which stages cannot be read.
            dmodel = read_chain(self.adapter, draft_worker, "EagleDraftWorker.draft_runner", "ModelRunner.model")
            missing = {} if dmodel is MISSING else self.stage_taps.attach(dmodel)
            self.contract["unrecorded_stages"] = unrecorded_stages(draft_worker, self.adapter, missing,
                                                                   with_graphs=False)
            self.adopt(self.contract)
            self.topk = int(known(self.contract, "spec_topk", 1))
            # The vocab map as served: d2t = hot_token_id - arange (zeros = identity, no d2t).
            first = []
            hot = hot_token_id(draft_worker, self.adapter)
            vd = known(self.contract, "draft_vocab_size")
            if hot is not MISSING and (hot is not None or vd):
                ar = torch.arange(vd if hot is None else hot.numel(), dtype=torch.int64)
                first.append(("draft.d2t", torch.zeros_like(ar) if hot is None else hot - ar, -1, ar.numpy()))
            sa = self.adapter.get(draft_worker, "EagleDraftWorker.server_args")
            port = MISSING if sa is MISSING else self.adapter.get(sa, "ServerArgs.port")
            if isinstance(port, int):
                from specdiff.tracer.live import register_server

                register_server(port=port, trace=self.opts.path)
            self.open(self.contract, first,
                      side={"hidden_size": self.hidden_size, "num_aux": self.num_aux, "topk": self.topk})
            logger.info("specdiff: recording an EAGLE-3 trace to %s (capture %s)", self.opts.path,
                        self.opts.capture)

    def close_facts(self) -> dict:
        return self.prefill.contract()

    def record_crash(self, exc: BaseException, cap: IterCapture | None) -> None:
        """The scheduler raised inside a recorded iteration: write the exception, the forward it
        happened in, the shapes involved and the iteration's requests with their token ids into the
        trace, and close it (before the process dies).

        What the iteration recorded before it raised (its requests' sequences with the prompt, the
        target rows of a target forward that completed) is written too, attributed as usual
        (``write_capture``): a crash in the draft leaves the target's view of the crashing prompt."""
        from specdiff.tracer.crash import crash_record, describe_crash

        forward, shapes = self.phase if self.phase is not None else (None, {})
        crash = crash_record(exc, forward=forward, forward_shapes=shapes,
                             iteration=None if cap is None else cap.iter,
                             kind=None if cap is None else cap.kind,
                             rids=() if cap is None else cap.batch_rids or cap.rids,
                             prompts=None if cap is None else cap.prompts)
        logger.error("specdiff: the server raised %s; the trace %s keeps the contract and this crash",
                     describe_crash(crash), self.opts.path)
        if cap is not None and self.active:
            try:
                self.finish(cap, None)
            except Exception as exc2:  # noqa: BLE001 - the crash record itself must still be written
                logger.error("specdiff: the crashing iteration's rows were not written (%s: %s)",
                             type(exc2).__name__, exc2)
        self.close(crash=crash)

    # -- capture helpers (hot path) --
    def _custom_params(self, req):
        sp = self.adapter.get(req, "Req.sampling_params")
        return None if sp is MISSING or sp is None else self.adapter.get(sp, "SamplingParams.custom_params")

    def begin(self, batch) -> IterCapture | None:
        """Start one iteration's capture, or None (nothing to record, or SGLang lacks a name the
        attribution needs: logged once by the adapter, listed in the contract's ``unobservable``)."""
        A = self.adapter
        reqs = A.get(batch, "ScheduleBatch.reqs")
        if not reqs:
            return None
        reqs = list(reqs)
        A.check_instance(reqs[0], "Req.rid", "Req.origin_input_ids")
        rids = [A.get(r, "Req.rid") for r in reqs]
        if MISSING in rids:
            return None
        rids = [str(r) for r in rids]
        new = self.choose(rids, lambda i: self._custom_params(reqs[i]))
        keep = [b for b, rid in enumerate(rids) if self.keep_rid(rid)]
        if not keep:
            return None
        it = A.get(batch, "ScheduleBatch.forward_iter")
        if it is None or it is MISSING:  # SGLang leaves it None on some paths: count our own calls
            it = self._iter
        self._iter += 1
        mode = A.get(batch, "ScheduleBatch.forward_mode")
        if mode is MISSING:
            return None
        kind = "prefill" if mode.is_extend() else "decode"
        cap = IterCapture(iter=int(it), kind=kind, rids=rids, reasons=new)
        prefix_lens = extend_lens = None
        if kind == "prefill":
            prefix, extend = A.get(batch, "ScheduleBatch.prefix_lens"), A.get(batch, "ScheduleBatch.extend_lens")
            if prefix is MISSING or extend is MISSING:
                return None
            prefix_lens, extend_lens = [int(x) for x in prefix], [int(x) for x in extend]
            cap.prefix_lens, cap.extend_lens = prefix_lens, extend_lens
            self.prefill.note(A, reqs, rids, prefix_lens, extend_lens, self.keep_rid)
            for r, rid in zip(reqs, rids, strict=True):
                self.note_prompt(cap, rid, lambda r=r: A.get(r, "Req.origin_input_ids"))
        if len(keep) < len(rids):  # copy only the recorded requests' rows (row_select)
            cap.rows = RowSelection(keep, len(rids), extend_lens)
            cap.batch_index, cap.batch_rids, cap.rids = keep, rids, [rids[b] for b in keep]
            if kind == "prefill":
                cap.prefix_lens, cap.extend_lens = [prefix_lens[b] for b in keep], [extend_lens[b] for b in keep]
        seq_lens = A.get(batch, "ScheduleBatch.seq_lens")
        if seq_lens is MISSING:
            return None
        self.cur = cap  # snap copies into the writer's ring on the capture's behalf
        cap.t["seq_lens"] = self.snap(seq_lens)
        return cap

    def snap(self, t, owner=None, dtype=None):
        """``ServingRecorder.snap`` of the recorded requests' rows of ``t`` (selected on its device,
        ``row_select.RowSelection``) when the capture ``owner`` (default ``cur``) left some out."""
        rows = getattr(self.cur if owner is None else owner, "rows", None)  # (an owner may be any object)
        if rows is not None and t is not None:
            t = rows.rows(t)
        return super().snap(t, owner, dtype)

    def finish(self, cap: IterCapture, result) -> None:
        if cap.kind == "prefill" and result is not None:
            nti = self.adapter.get(result, "GenerationBatchResult.next_token_ids")
            if nti is not None and nti is not MISSING and "next_token_ids" not in cap.t:
                cap.t["next_token_ids"] = self.snap(nti, cap)
        cap.rows = None  # its device index tensors stay here (the capture is pickled to the writer)
        self.sync_unobservable()
        if _CUDA and any(_on_cuda(v) for v in cap.t.values()):
            ev = torch.cuda.Event()
            ev.record()
            cap.event = ev
        self.writer.submit(cap)

    def capture_draft_forward(self, mode: str, forward_batch, logits_output) -> DraftForward:
        A = self.adapter
        df = DraftForward(mode=mode)
        df.input_ids = self._snap_present(A.get(forward_batch, "ForwardBatch.input_ids"))
        df.positions = self._snap_present(A.get(forward_batch, "ForwardBatch.positions"))
        if self.fc_sink:
            df.fc_in, df.fc_out = self.fc_sink[-1]
        df.hidden = self._snap_present(A.get(logits_output, "LogitsProcessorOutput.hidden_states"))
        logits = A.get(logits_output, "LogitsProcessorOutput.next_token_logits")
        if logits is not None and logits is not MISSING and logits.dim() == 2 and logits.shape[0] > 0:
            lf = logits.detach()
            how = (self.opts.logits_topk, self.topk if mode == "decode" else None, self.opts.capture == "full")
            if lf.device.type == "cpu":  # one copy; the writer reduces (reduce_logits says why)
                df.raw_logits, df.reduce = self.snap(lf), how
            else:  # reduced on the device, the small results copied
                reduce_logits(df, lf, *how)
                for name in ("lt_values", "lt_ids", "lse", "topk_ids", "logits"):
                    setattr(df, name, self.snap(getattr(df, name)))
        return df

    def ensure_fc_hook(self, model) -> None:
        key = id(model)
        if key in self._hooked_models:
            return
        self._hooked_models.add(key)
        A = self.adapter
        inner = A.get(model, "LlamaForCausalLMEagle3.model")
        fc = MISSING if inner is MISSING else A.get(inner, "Eagle3LlamaModel.fc")
        if not isinstance(fc, torch.nn.Module):
            if fc is not MISSING:  # present but not a module: say so once, like a missing name
                A.mark_missing("Eagle3LlamaModel.fc", f"draft fc is a {type(fc).__name__}, not a module")
            return
        rec = self

        def _fc_hook(_mod, _inp, out):
            sink = rec.fc_sink
            if sink is None or not rec.enabled or _capturing():
                return None
            try:
                o = out[0] if isinstance(out, tuple) else out
                # fc's input is the aux concat after SGLang's input_norm / fc_norm (llama_eagle3.py:237-247).
                sink.append((rec.snap(_inp[0]), rec.snap(o)))
            except Exception as exc:  # noqa: BLE001
                rec.fail("draft fc", exc)
            return None

        fc.register_forward_hook(_fc_hook)

    def refresh(self, draft_worker) -> None:
        """Facts SGLang settles only at the end of start-up (after ``_capture_cuda_graphs``): the
        aux capture (layers_to_capture) and the stages CUDA graphs hide; written before any request."""
        facts = aux_capture_facts(self.adapter, draft_worker)
        taps = self.stage_taps
        facts["unrecorded_stages"] = unrecorded_stages(draft_worker, self.adapter, taps.unrecorded,
                                                       layer_outs=taps.layer_outs)
        hidden = graph_hidden_stages(draft_worker, self.adapter)
        if known(facts, "unrecorded_stages") and hidden != UNKNOWN:  # the midlayer taps a graph hides too
            graphs = graph_hidden(draft_decode_graph="tokens" in hidden, draft_extend_graph="draft.fc_out" in hidden,
                                  layer_outs=taps.layer_outs)
            hidden = sorted(set(hidden) | set(graphs))
        facts["graph_hidden_stages"] = hidden
        self.num_aux = len(known(facts, "aux_hf_indices") or []) or None
        self.update_contract(**facts)
        self.sync_unobservable()

    def _snap_present(self, v):
        return None if v is MISSING else self.snap(v)


def _on_cuda(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_pinned()


