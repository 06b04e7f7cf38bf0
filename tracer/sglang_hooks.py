"""Hook functions and row attribution of the SGLang EAGLE-3 recorder (SGLang 0.5.23, worker v2).

Hot path (in the scheduler's forward): hooks only *clone* tensors (CPU) or copy them with
``non_blocking=True`` into pinned host memory (CUDA), compute a few small reductions on the
device (draft logits top-k and logsumexp), and collect them in an ``IterCapture`` for the
current ``EAGLEWorkerV2.forward_batch_generation`` call. At the end of that call the capture
(plus a CUDA event) goes to the background writer; ``write_capture`` runs there, after the
event, and attributes rows to ``(seq, pos, depth, iter)`` (tracer/schema.py).

Attribution (EAGLE-3 pairing: the draft row at t consumes (h_t, x_{t+1}) at depth 0, and its
own feedback with token x_{t+1+k} at depth k):

- prefill, request b with prefix p and extend e: target rows at t = p..p+e-1 (iter -1); the
  draft extend reads ``x_{t+1}`` at row t (the last one is the sampled token), depth 0; its
  logits / hidden exist only for the last row t = p+e-1 (capture LAST).
- decode iteration with committed KV length L (the root / previous bonus token sits at L),
  accept length a: accepted tree nodes are at t = L..L+a-1 (their target aux rows, predict =
  target argmax, and the draft-extend rows of the same positions, depth 0). The draft steps
  of the iteration continue from the last draft-extend row of the previous iteration, at
  t = L-1: forward i (0-based) is depth i+1; ``select_top_k_tokens(i)`` gets the mapped ids
  of depth i. With topk > 1 a (seq, pos, depth) key holds topk rows (one per branch); the
  first row of each depth continues the first row of the depth above (``_branch_order``).
- the midlayer taps (``sglang_draft_stages``: hidden_in, positions, attn_in, hidden_out) come in
  each draft forward's row order and are attributed like its input ids: every prefill row,
  the accepted draft-extend rows, every draft-step branch.
- ``verify.*`` rows are keyed by pos = L (the tree root's position), depth 0.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from specdiff.eagle3.aux_layers import native_aux_ids
from specdiff.tracer.contract import AUX_CONCAT_ORDER, UNKNOWN, known
from specdiff.tracer.errors import SpecdiffError
from specdiff.tracer.rows import RowBatch
from specdiff.tracer.sglang_adapter import MISSING, SGLangAdapter
from specdiff.tracer.sglang_draft_stages import DraftStageTaps, graph_hidden

logger = logging.getLogger("specdiff.tracer")


# ---- options --------------------------------------------------------------------------------
@dataclass
class Options:
    """Recorder options, read from the environment (see ``from_env``)."""

    path: str
    capture: str = "default"  # "default" | "full"
    logits_topk: int = 8
    rids: str | None = None
    eager_draft: bool = False
    max_queue_mb: int = 2048

    @classmethod
    def from_env(cls, env) -> Options | None:
        """Options from ``SPECDIFF_*`` variables; None when ``SPECDIFF_TRACE`` is unset or empty.

        An unset or empty variable takes its default. A value that cannot be used is never
        replaced by a default: :class:`OptionError` names the variable, the value given and the
        values accepted (the plugin then refuses to trace, in one log line).
        """
        path = env.get("SPECDIFF_TRACE")
        if not path:
            return None
        return cls(path=path,
                   capture=_env_choice(env, "SPECDIFF_CAPTURE", ("default", "full"), default="default"),
                   logits_topk=_env_int(env, "SPECDIFF_LOGITS_TOPK", 8),
                   max_queue_mb=_env_int(env, "SPECDIFF_MAX_QUEUE_MB", 2048),
                   rids=_env_regex(env, "SPECDIFF_RIDS"),
                   eager_draft=_env_flag(env, "SPECDIFF_EAGER_DRAFT"))


class OptionError(SpecdiffError):
    """A ``SPECDIFF_*`` variable holds a value the recorder cannot use."""

    def __init__(self, name: str, raw: str, accepted: str):
        super().__init__(f"{name}={raw!r} is not valid; accepted values: {accepted}")
        self.name = name


def _given(env, name: str) -> str | None:
    raw = env.get(name)
    return None if raw is None or not raw.strip() else raw


def _env_choice(env, name: str, choices: tuple[str, ...], *, default: str) -> str:
    raw = _given(env, name)
    if raw is None:
        return default
    if raw.strip().lower() not in choices:
        raise OptionError(name, raw, " or ".join(choices))
    return raw.strip().lower()


def _env_int(env, name: str, default: int, *, minimum: int = 1) -> int:
    raw = _given(env, name)
    if raw is None:
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        v = None
    if v is None or v < minimum:
        raise OptionError(name, raw, f"an integer >= {minimum} (default {default})")
    return v


def _env_regex(env, name: str) -> str | None:
    raw = _given(env, name)
    if raw is None:
        return None
    try:
        re.compile(raw)
    except re.error as exc:
        raise OptionError(name, raw, f"a Python regular expression (this one: {exc})") from None
    return raw


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _env_flag(env, name: str) -> bool:
    raw = _given(env, name)
    if raw is None:
        return False
    v = raw.strip().lower()
    if v not in _TRUE + _FALSE:
        raise OptionError(name, raw, "/".join(_TRUE) + " or " + "/".join(_FALSE))
    return v in _TRUE


# ---- host copies ----------------------------------------------------------------------------
def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def snap(t):
    """A host copy of ``t`` that later device work cannot change: clone on CPU, non-blocking
    copy into pinned memory on an accelerator (valid once the capture's event completes)."""
    if t is None:
        return None
    t = t.detach()
    if t.device.type == "cpu":
        return t.clone()
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


@dataclass
class DraftForward:
    """One draft ModelRunner.forward: mode, inputs and reduced outputs (host copies)."""

    mode: str  # "extend" (prefill draft extend) | "extend_v2" (decode draft extend) | "decode"
    input_ids: Any = None
    positions: Any = None
    fc_in: Any = None
    fc_out: Any = None
    hidden: Any = None
    logits: Any = None  # full (capture full)
    lt_values: Any = None
    lt_ids: Any = None
    lse: Any = None
    topk_ids: Any = None  # draft-vocab top-k computed from the logits (draft steps)
    stages: dict = field(default_factory=dict)  # midlayer taps (sglang_draft_stages), forward row order


@dataclass
class IterCapture:
    """Everything recorded in one ``forward_batch_generation`` call."""

    iter: int
    kind: str  # "prefill" | "decode"
    rids: list[str]
    prompts: dict[str, list[int]] = field(default_factory=dict)
    prefix_lens: list[int] | None = None
    extend_lens: list[int] | None = None
    t: dict[str, Any] = field(default_factory=dict)
    draft: list[DraftForward] = field(default_factory=list)
    select: list[tuple[int, Any]] = field(default_factory=list)
    branch_parents: dict[int, Any] = field(default_factory=dict)  # select_top_k_tokens(i) tree_info[2]
    event: Any = None

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def nbytes(self) -> int:
        n = sum(v.nbytes for v in self.t.values() if isinstance(v, torch.Tensor))
        n += sum(v.nbytes for _, v in self.select if isinstance(v, torch.Tensor))
        for d in self.draft:
            n += sum(v.nbytes for v in vars(d).values() if isinstance(v, torch.Tensor))
            n += sum(v.nbytes for v in d.stages.values())
        return n


# ---- the recorder ---------------------------------------------------------------------------
class Recorder:
    """Process-wide recorder state (one per scheduler process, TP rank 0)."""

    def __init__(self, opts: Options, adapter: SGLangAdapter | None = None):
        self.opts = opts
        self.adapter = adapter if adapter is not None else SGLangAdapter.for_running_sglang()
        self._unobservable_n = 0  # adapter.missing entries already in the trace's contract
        self._prompt_firsts: list[int] = []  # first token of each recorded prompt (bos_added)
        self.bos_token_id = None
        self.in_iteration = False  # inside EAGLEWorkerV2.forward_batch_generation
        self.phase: tuple[str, dict] | None = None  # (model forward running, its input shapes)
        self.enabled = True
        self.cur: IterCapture | None = None
        self.fc_sink: list | None = None
        self.writer = None  # AsyncTraceWriter
        self.contract: dict = {}
        self.hidden_size: int | None = None
        self.num_aux: int | None = None
        self.topk: int = 1
        self.rid_re = re.compile(opts.rids) if opts.rids else None
        self._iter = 0
        self._hooked_models: set[int] = set()
        self.stage_taps = DraftStageTaps(snap=snap, capturing=_capturing, on_error=self.fail)
        self._failed_once = False
        self._lock = threading.Lock()
        self._seen_prompts: set[str] = set()
        self.hook_s = 0.0  # wall time spent inside the hooks on the serving thread
        self.iter_s = 0.0  # wall time of the recorded forward_batch_generation calls
        # writer-thread state
        self.seq_ids: dict[str, int] = {}
        self.seq_tokens: dict[str, list[int]] = {}
        self.seq_prompt: dict[str, int] = {}

    # -- lifecycle --
    def fail(self, where: str, exc: BaseException) -> None:
        self.enabled = False
        self.cur = None
        if not self._failed_once:
            self._failed_once = True
            logger.error("specdiff: recorder hook %s failed (%s: %s); tracing disabled, the server "
                         "keeps serving", where, type(exc).__name__, exc)

    @property
    def active(self) -> bool:
        return self.enabled and (self.writer is None or self.writer.active)

    def start(self, draft_worker) -> None:
        """Build the contract from the live ``EagleDraftWorker`` and open the trace (once).

        Called after ``EagleDraftWorker.alloc_memory_pool`` (start-up, before any request), or
        at the first iteration when that hook did not run.
        """
        with self._lock:
            if self.writer is not None or not self.enabled:
                return
            from specdiff.tracer.async_writer import AsyncTraceWriter
            from specdiff.tracer.store import TraceWriter

            self.contract = contract_from_worker(draft_worker, self.opts, self.adapter)
            # Hooks on the draft's midlayer now, so the contract says which stages cannot be read.
            dmodel = _chain(self.adapter, draft_worker, "EagleDraftWorker.draft_runner", "ModelRunner.model")
            missing = {} if dmodel is MISSING else self.stage_taps.attach(dmodel)
            self.contract["unrecorded_stages"] = unrecorded_stages(draft_worker, self.adapter, missing,
                                                                   with_graphs=False)
            self.hidden_size = known(self.contract, "hidden_size")
            self.num_aux = len(known(self.contract, "aux_hf_indices") or []) or None
            self.topk = int(known(self.contract, "spec_topk", 1))
            self._unobservable_n = len(self.contract["unobservable"])
            bos = self.contract.pop("bos_token_id", None)
            self.bos_token_id = None if bos == UNKNOWN else bos
            tw = TraceWriter(self.opts.path, side="serve", contract=self.contract)
            # The vocab map as served: d2t = hot_token_id - arange (zeros = identity, no d2t).
            hot = hot_token_id(draft_worker, self.adapter)
            vd = known(self.contract, "draft_vocab_size")
            if hot is not MISSING and (hot is not None or vd):
                ar = torch.arange(vd if hot is None else hot.numel(), dtype=torch.int64)
                tw.append("draft.d2t", torch.zeros_like(ar) if hot is None else hot - ar, seq=-1, pos=ar.numpy())
            sa = self.adapter.get(draft_worker, "EagleDraftWorker.server_args")
            port = MISSING if sa is MISSING else self.adapter.get(sa, "ServerArgs.port")
            if isinstance(port, int):
                from specdiff.tracer.live import register_server

                register_server(port=port, trace=self.opts.path)
            self.writer = AsyncTraceWriter(tw, self._write, max_items=64,
                                           max_bytes=self.opts.max_queue_mb << 20)
            logger.info("specdiff: recording an EAGLE-3 trace to %s (capture %s)", self.opts.path,
                        self.opts.capture)

    def close(self, *, crash: dict | None = None) -> None:
        """Drain the writer and close the trace; ``crash`` (tracer/crash.py) goes into the contract."""
        w = self.writer
        if w is None:
            return
        self.enabled = False
        cost = {"recorder_hook_s": round(self.hook_s, 4), "recorder_iter_s": round(self.iter_s, 4),
                "recorder_writer_s": round(w.busy_s, 4), "unobservable": self.adapter.unobservable()}
        if crash is not None:
            cost["crash"] = crash
        from specdiff.tracer.contract import bos_added_fact

        cost["bos_added"] = bos_added_fact(self._prompt_firsts, self.bos_token_id)
        if w.close(contract=cost):
            logger.info("specdiff: trace closed: %s (%d iterations written, %d dropped; hooks %.2f s of "
                        "%.2f s in recorded forwards, writer thread %.2f s)", self.opts.path, w.written,
                        w.dropped, self.hook_s, self.iter_s, w.busy_s)

    def record_crash(self, exc: BaseException, cap: IterCapture | None) -> None:
        """The scheduler raised inside a recorded iteration: write the exception, the forward it
        happened in and the shapes involved into the trace, and close it (before the process dies)."""
        from specdiff.tracer.crash import crash_record, describe_crash

        forward, shapes = self.phase if self.phase is not None else (None, {})
        crash = crash_record(exc, forward=forward, forward_shapes=shapes,
                             iteration=None if cap is None else cap.iter,
                             kind=None if cap is None else cap.kind, rids=() if cap is None else cap.rids)
        logger.error("specdiff: the server raised %s; the trace %s keeps the contract and this crash",
                     describe_crash(crash), self.opts.path)
        self.close(crash=crash)

    # -- capture helpers (hot path) --
    def keep_rid(self, rid: str) -> bool:
        rid = str(rid)
        if rid.startswith("HEALTH_CHECK"):  # SGLang's /health probes, not user requests
            return False
        return self.rid_re is None or bool(self.rid_re.search(rid))

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
        if not any(self.keep_rid(r) for r in rids):
            return None
        it = A.get(batch, "ScheduleBatch.forward_iter")
        if it is None or it is MISSING:  # SGLang leaves it None on some paths: count our own calls
            it = self._iter
        self._iter += 1
        mode = A.get(batch, "ScheduleBatch.forward_mode")
        if mode is MISSING:
            return None
        kind = "prefill" if mode.is_extend() else "decode"
        cap = IterCapture(iter=int(it), kind=kind, rids=rids)
        if kind == "prefill":
            prefix, extend = A.get(batch, "ScheduleBatch.prefix_lens"), A.get(batch, "ScheduleBatch.extend_lens")
            if prefix is MISSING or extend is MISSING:
                return None
            cap.prefix_lens = [int(x) for x in prefix]
            cap.extend_lens = [int(x) for x in extend]
            for r, rid in zip(reqs, rids, strict=True):
                if rid not in self._seen_prompts:
                    prompt = A.get(r, "Req.origin_input_ids")
                    cap.prompts[rid] = [] if prompt is MISSING else [int(x) for x in prompt]
                    if cap.prompts[rid]:
                        self._prompt_firsts.append(cap.prompts[rid][0])
                    self._seen_prompts.add(rid)
        seq_lens = A.get(batch, "ScheduleBatch.seq_lens")
        if seq_lens is MISSING:
            return None
        cap.t["seq_lens"] = snap(seq_lens)
        return cap

    def finish(self, cap: IterCapture, result) -> None:
        if cap.kind == "prefill" and result is not None:
            nti = self.adapter.get(result, "GenerationBatchResult.next_token_ids")
            if nti is not None and nti is not MISSING and "next_token_ids" not in cap.t:
                cap.t["next_token_ids"] = snap(nti)
        self.sync_unobservable()
        if torch.cuda.is_available() and any(_on_cuda(v) for v in cap.t.values()):
            ev = torch.cuda.Event()
            ev.record()
            cap.event = ev
        self.writer.submit(cap)

    def capture_draft_forward(self, mode: str, forward_batch, logits_output) -> DraftForward:
        A = self.adapter
        df = DraftForward(mode=mode)
        df.input_ids = _snap_present(A.get(forward_batch, "ForwardBatch.input_ids"))
        df.positions = _snap_present(A.get(forward_batch, "ForwardBatch.positions"))
        if self.fc_sink:
            df.fc_in, df.fc_out = self.fc_sink[-1]
        df.hidden = _snap_present(A.get(logits_output, "LogitsProcessorOutput.hidden_states"))
        logits = A.get(logits_output, "LogitsProcessorOutput.next_token_logits")
        if logits is not None and logits is not MISSING and logits.dim() == 2 and logits.shape[0] > 0:
            lf = logits.detach()
            k = min(self.opts.logits_topk, lf.shape[-1])
            vals, ids = torch.topk(lf, k, dim=-1)
            df.lt_values, df.lt_ids = snap(vals), snap(ids)
            df.lse = snap(torch.logsumexp(lf.float(), dim=-1))
            if mode == "decode":
                df.topk_ids = snap(torch.topk(lf, min(self.topk, lf.shape[-1]), dim=-1).indices)
            if self.opts.capture == "full":
                df.logits = snap(lf)
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
                sink.append((snap(_inp[0]), snap(o)))
            except Exception as exc:  # noqa: BLE001
                rec.fail("draft fc", exc)
            return None

        fc.register_forward_hook(_fc_hook)

    def refresh(self, draft_worker) -> None:
        """Facts SGLang settles only at the end of start-up (after ``_capture_cuda_graphs``): the
        aux capture (layers_to_capture) and the stages CUDA graphs hide; written before any request."""
        facts = aux_capture_facts(self.adapter, draft_worker)
        facts["unrecorded_stages"] = unrecorded_stages(draft_worker, self.adapter, self.stage_taps.unrecorded)
        hidden = graph_hidden_stages(draft_worker, self.adapter)
        if known(facts, "unrecorded_stages") and hidden != UNKNOWN:  # the midlayer taps a graph hides too
            graphs = graph_hidden(draft_decode_graph="tokens" in hidden, draft_extend_graph="draft.fc_out" in hidden)
            hidden = sorted(set(hidden) | set(graphs))
        facts["graph_hidden_stages"] = hidden
        self.num_aux = len(known(facts, "aux_hf_indices") or []) or None
        self.update_contract(**facts)
        self.sync_unobservable()

    def update_contract(self, **facts) -> None:
        """Merge facts learned after the trace was opened (written by the writer thread)."""
        self.contract.update(facts)
        if self.writer is not None:
            self.writer.submit(ContractUpdate(dict(facts)))

    def sync_unobservable(self) -> None:
        """Queue a contract update when SGLang names went missing after the trace was opened
        (instance attributes first seen in a batch)."""
        n = len(self.adapter.missing)
        if n != self._unobservable_n and self.writer is not None:
            self._unobservable_n = n
            self.update_contract(unobservable=self.adapter.unobservable())

    # -- writer thread --
    def _write(self, tw, item) -> None:
        if isinstance(item, ContractUpdate):
            tw.set_contract(**item.facts)
            return
        write_capture(self, tw, item)


@dataclass
class ContractUpdate:
    """Contract facts learned after the trace was opened, written by the writer thread."""

    facts: dict

    def nbytes(self) -> int:
        return 0


def _snap_present(v):
    return None if v is MISSING else snap(v)


def _on_cuda(v) -> bool:
    return isinstance(v, torch.Tensor) and v.is_pinned()


# ---- contract -------------------------------------------------------------------------------
def _chain(adapter: SGLangAdapter, obj, *keys: str):
    """Follow ``keys`` from ``obj`` through the adapter; MISSING as soon as one step is absent."""
    for key in keys:
        if obj is MISSING:
            return MISSING
        obj = adapter.get(obj, key)
    return obj


def _cfg(cfg, attr: str, fact: str, what: str):
    """A Hugging Face config attribute the engine built its model from, or UNKNOWN (one warning)."""
    if cfg is MISSING:
        return UNKNOWN
    if not hasattr(cfg, attr):
        logger.warning("specdiff: the %s config SGLang loaded has no %s; contract fact %s is unknown",
                       what, attr, fact)
        return UNKNOWN
    return getattr(cfg, attr)


def hot_token_id(dw, adapter: SGLangAdapter):
    """The draft->target id map SGLang applies (int64 [Vd] on the host), None (identity: no d2t),
    or MISSING (SGLang has no name for it here; logged by the adapter).

    SGLang 0.5.23 llama_eagle3.py:350-352: ``hot_token_id = d2t + arange``; copied to the draft
    worker by ``EagleDraftWorker.init_lm_head``. Read once at startup, never on the hot path.
    """
    hot = _chain(adapter, dw, "EagleDraftWorker.hot_token_id")
    if hot is None:  # the worker's copy is made in init_lm_head; the model holds the loaded one
        hot = _chain(adapter, dw, "EagleDraftWorker.draft_runner", "ModelRunner.model",
                     "LlamaForCausalLMEagle3.hot_token_id")
    if hot is None or hot is MISSING:
        return hot
    return hot.detach().to("cpu", torch.int64)


def aux_capture_facts(adapter: SGLangAdapter, dw) -> dict:
    """``aux_hf_indices`` / ``aux_dropped_ids`` / ``aux_concat_order`` as the target really captures.

    SGLang 0.5.23 llama.py: layer i captures its input (HF hidden_states[i]) when i is in
    ``layers_to_capture`` and ``capture_aux_hidden_states`` is on; only i in [start_layer,
    end_layer) runs, so a larger index (id L-1) is never captured. Captures are appended in the
    layer loop: the concat is ascending. ``layers_to_capture`` is set by the target's
    ``ModelRunner.init_attention_backends`` (model_runner.py:1105), after ``alloc_memory_pool``:
    read it from ``_capture_cuda_graphs`` on (the contract says unknown until then).
    """
    tmodel = _chain(adapter, dw, "EagleDraftWorker.target_worker", "TpModelWorker.model_runner", "ModelRunner.model")
    on = _chain(adapter, tmodel, "LlamaForCausalLM.capture_aux_hidden_states")
    inner = _chain(adapter, tmodel, "LlamaForCausalLM.model")
    ltc = _chain(adapter, inner, "LlamaModel.layers_to_capture")
    start = _chain(adapter, inner, "LlamaModel.start_layer")
    end = _chain(adapter, inner, "LlamaModel.end_layer")
    if MISSING in (on, ltc, start, end):
        return {"aux_hf_indices": UNKNOWN, "aux_dropped_ids": UNKNOWN, AUX_CONCAT_ORDER: UNKNOWN}
    idx = sorted({int(i) for i in ltc}) if on else []  # capture off: the draft gets the final hidden only
    captured = [i for i in idx if start <= i < end]
    return {"aux_hf_indices": captured, "aux_dropped_ids": native_aux_ids([i for i in idx if not start <= i < end], "sglang"),
            AUX_CONCAT_ORDER: list(captured)}  # slot j of the concat = HF captured[j]


#: tensors SGLang's prefill draft extend produces for each request's last prompt row only
PREFILL_LAST_ONLY = ("draft.logits", "draft.logits_topk.values", "draft.logits_topk.ids", "draft.logsumexp",
                     "draft.topk", "draft.topk_target")


def unrecorded_stages(dw, adapter: SGLangAdapter, missing: dict, *, with_graphs: bool = True) -> dict:
    """Tensor -> why the recorder cannot observe (some of) its rows: a midlayer module SGLang's
    draft lacks (``missing``, from ``DraftStageTaps.attach``), a CUDA graph replay, and the logits
    a prefill draft extend prunes to each request's last row (capture LAST).

    ``with_graphs=False`` at start-up: the draft's graph runners exist only after
    ``_capture_cuda_graphs`` (``Recorder.refresh`` adds them), and reading them earlier would
    report them as missing SGLang names."""
    out = dict(missing)
    if with_graphs:
        graph = _chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner")
        graph_extend = _chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner_for_draft_extend")
        for name, why in graph_hidden(draft_decode_graph=graph not in (None, MISSING),
                                      draft_extend_graph=graph_extend not in (None, MISSING)).items():
            out[name] = f"{out[name]}; {why}" if name in out else why
    why = ("a prefill draft extend keeps logits only for each request's last prompt row (SGLang "
           "eagle_worker_v2.py _draft_extend_for_prefill, capture LAST): earlier prompt positions "
           "have no draft logits / top-k on serving")
    for name in PREFILL_LAST_ONLY:
        out[name] = f"{out[name]}; {why}" if name in out else why
    return out


def graph_hidden_stages(dw, adapter: SGLangAdapter):
    """Stages the draft's captured CUDA graphs hide from the recorder (sorted), or UNKNOWN.

    Target graphs return their outputs, so nothing the recorder reads from the target is hidden.
    """
    graph = _chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner")
    graph_extend = _chain(adapter, dw, "EagleDraftWorker.cuda_graph_runner_for_draft_extend")
    if MISSING in (graph, graph_extend):
        return UNKNOWN
    hidden = []
    if graph is not None:
        hidden += ["tokens", "draft.hidden_out", "draft.logits", "draft.topk", "draft.topk_target"]
    if graph_extend is not None:
        hidden += ["draft.fc_out", "draft.hidden_out", "draft.logits", "draft.topk"]
    return sorted(set(hidden))


def _same_tensor(a, b) -> bool:
    return a is not MISSING and b is not MISSING and a.data_ptr() == b.data_ptr() and a.shape == b.shape


def _weight_sha(w, rows, what: str):
    """weight_sha256 of the first ``rows`` rows, or UNKNOWN (shard of a TP rank, or rows unknown)."""
    from specdiff.tracer.contract import weight_sha256

    if w is MISSING or not isinstance(rows, int):
        return UNKNOWN
    if w.shape[0] < rows:
        logger.warning("specdiff: the draft's %s holds %d of %d rows on this rank (tensor parallel); "
                       "its sha256 is unknown", what, w.shape[0], rows)
        return UNKNOWN
    return weight_sha256(w, rows=rows)


def _weights_facts(A: SGLangAdapter, *, target_runner, dmodel, dinner, vocab, draft_vocab) -> dict:
    """sha256 and source of the embedding and lm_head the draft multiplies by.

    SGLang 0.5.23 EagleDraftWorker.init_lm_head: an EAGLE-3 draft gets the target's embedding
    (``set_embed``) and keeps its own lm_head unless ``load_lm_head_from_target``; "source" is
    'target' when the draft's weight is the target's very tensor, else 'draft'.
    """
    tmodel = _chain(A, target_runner, "ModelRunner.model")
    tembed = _chain(A, tmodel, "LlamaForCausalLM.model", "LlamaModel.embed_tokens", "VocabParallelEmbedding.weight")
    thead = _chain(A, tmodel, "LlamaForCausalLM.lm_head", "VocabParallelEmbedding.weight")
    dembed = _chain(A, dinner, "Eagle3LlamaModel.embed_tokens", "VocabParallelEmbedding.weight")
    dhead = _chain(A, dmodel, "LlamaForCausalLMEagle3.lm_head", "VocabParallelEmbedding.weight")
    out = {"embed_sha256": _weight_sha(dembed, vocab, "embedding"),
           "lm_head_sha256": _weight_sha(dhead, draft_vocab, "lm_head")}
    out["embed_source"] = (UNKNOWN if MISSING in (dembed, tembed) else
                           "target" if _same_tensor(dembed, tembed) else "draft")
    out["lm_head_source"] = (UNKNOWN if dhead is MISSING or (thead is MISSING and tembed is MISSING) else
                             "target" if _same_tensor(dhead, thead) or _same_tensor(dhead, tembed) else "draft")
    return out


#: SGLang rotary-embedding class -> (rope_scaling type, adapter keys of its parameters -> fact keys)
_ROPE_CLASSES = {
    "RotaryEmbedding": (None, {}),
    "LinearScalingRotaryEmbedding": ("linear", {"LinearScalingRotaryEmbedding.scaling_factors": "factor"}),
    "Llama3RotaryEmbedding": ("llama3", {"Llama3RotaryEmbedding.scaling_factor": "factor",
                                         "Llama3RotaryEmbedding.low_freq_factor": "low_freq_factor",
                                         "Llama3RotaryEmbedding.high_freq_factor": "high_freq_factor",
                                         "Llama3RotaryEmbedding.orig_max_position":
                                             "original_max_position_embeddings"}),
}


def _rope_facts(A: SGLangAdapter, dinner) -> dict:
    """rope_theta / rope_scaling / rope_style as the draft's attention applies them (its
    ``rotary_emb``, built by get_rope from the draft config). Another rope class is recorded by
    its class name, so it is compared, never guessed."""
    from specdiff.tracer.contract import rope_scaling_fact

    layers = _chain(A, dinner, "Eagle3LlamaModel.layers")
    rot = MISSING if layers is MISSING or len(layers) == 0 else _chain(
        A, layers[0], "LlamaDecoderLayer.self_attn", "LlamaAttention.rotary_emb")
    base = _chain(A, rot, "RotaryEmbedding.base")
    neox = _chain(A, rot, "RotaryEmbedding.is_neox_style")
    out = {"rope_theta": UNKNOWN if base is MISSING else float(base),
           "rope_style": UNKNOWN if neox is MISSING else ("neox" if neox else "gptj")}
    if rot is MISSING:
        out["rope_scaling"] = UNKNOWN
        return out
    cls = type(rot).__name__
    if cls not in _ROPE_CLASSES:
        out["rope_scaling"] = {"type": f"sglang {cls}"}
        return out
    kind, params = _ROPE_CLASSES[cls]
    values = {fact: A.get(rot, key) for key, fact in params.items()}
    if MISSING in values.values():
        out["rope_scaling"] = UNKNOWN
        return out
    values = {k: (v[0] if isinstance(v, (list, tuple)) and len(v) == 1 else v) for k, v in values.items()}
    out["rope_scaling"] = rope_scaling_fact(kind, **values)
    return out


def serving_config(adapter: SGLangAdapter):
    """SGLang's resolved serving config (``runtime_context.get_serving()``), or MISSING."""
    try:
        from sglang.srt import runtime_context

        return runtime_context.get_serving()
    except Exception as exc:  # noqa: BLE001 - an SGLang without it: the facts it feeds are unknown
        adapter.mark_missing("runtime_context.get_serving", f"{type(exc).__name__}: {exc}")
        return MISSING


def _tokenizer_facts(A: SGLangAdapter, serving) -> dict:
    """tokenizer / chat-template hashes of what SGLang's tokenizer process loads.

    Tokenizing happens in SGLang's main process, which the recorder (scheduler) does not see:
    the facts are the files at the resolved tokenizer path; a ``--chat-template`` override makes the
    template hash unknown (one warning) rather than the file's.
    """
    import os

    from specdiff.tracer.contract import tokenizer_hashes

    path = _chain(A, serving, "serving.tokenizer_path")
    override = _chain(A, serving, "serving.chat_template")
    if path is MISSING or not isinstance(path, str) or not os.path.isdir(path):
        if path is not MISSING:
            logger.warning("specdiff: tokenizer %r is not a local directory; contract facts tokenizer_sha256 "
                           "and chat_template_sha256 are unknown", path)
        return {"tokenizer_sha256": UNKNOWN, "chat_template_sha256": UNKNOWN}
    tok, tmpl = tokenizer_hashes(path)
    if override is MISSING or override:
        if override:
            logger.warning("specdiff: --chat-template %s is applied in SGLang's tokenizer process, which the "
                           "recorder does not see; contract fact chat_template_sha256 is unknown", override)
        tmpl = UNKNOWN
    return {"tokenizer_sha256": tok, "chat_template_sha256": tmpl}


def contract_from_worker(dw, opts: Options, adapter: SGLangAdapter, *, serving=None) -> dict:
    """Contract facts from a live ``EagleDraftWorker`` (called once, at start-up).

    ``serving``: SGLang's resolved serving config (default ``serving_config(adapter)``).

    Every fact is read from the engine's objects through the adapter; one it cannot read is
    ``UNKNOWN`` and the missing SGLang names are listed in ``unobservable`` (never filled in
    from a config file or a default).
    """
    from specdiff.eagle3.aux_layers import resolve_aux_ids
    from specdiff.tracer.contract import sha256_array

    A = adapter
    facts: dict = {"engine": "sglang", "engine_version": A.version, "capture_level": opts.capture,
                   "logits_topk": int(opts.logits_topk), "dropped_records": 0}
    # The CUDA graph runners exist only once _capture_cuda_graphs ran (after this): checked there.
    A.check_instance(dw, *(n.key for n in A.names if n.kind == "instance" and n.key.startswith("EagleDraftWorker.")
                           and "cuda_graph" not in n.key))
    target_runner = _chain(A, dw, "EagleDraftWorker.target_worker", "TpModelWorker.model_runner")
    draft_runner = _chain(A, dw, "EagleDraftWorker.draft_runner")
    tmc = _chain(A, target_runner, "ModelRunner.model_config")
    tcfg = _chain(A, tmc, "ModelConfig.hf_config")
    dcfg = _chain(A, draft_runner, "ModelRunner.model_config", "ModelConfig.hf_config")
    L = _cfg(tcfg, "num_hidden_layers", "num_layers", "target")
    facts.update(num_layers=L, hidden_size=_cfg(tcfg, "hidden_size", "hidden_size", "target"),
                 vocab_size=_cfg(tcfg, "vocab_size", "vocab_size", "target"),
                 draft_hidden_size=_cfg(dcfg, "hidden_size", "draft_hidden_size", "draft"))
    dtype = _chain(A, tmc, "ModelConfig.dtype")
    facts["dtype"] = UNKNOWN if dtype is MISSING else str(dtype).replace("torch.", "")
    # BOS id of the target config SGLang loaded: Recorder.close turns it into bos_added.
    facts["bos_token_id"] = getattr(tcfg, "bos_token_id", None) if tcfg is not MISSING else UNKNOWN
    # The ids as configured (SGLang reads them from the draft's hf_config.eagle_config) ...
    # No eagle_config attribute means "no ids" to SGLang too (llama_eagle3.py:169: getattr(config,
    # "eagle_config", None) or {}), so None is the fact here, not a fallback.
    eagle_config = UNKNOWN if dcfg is MISSING else getattr(dcfg, "eagle_config", None)
    if isinstance(eagle_config, str) or L == UNKNOWN:
        facts.update(aux_native_ids=UNKNOWN, aux_convention="sglang")
    else:
        ids = dict(eagle_config or {}).get("eagle_aux_hidden_state_layer_ids")
        res = resolve_aux_ids(ids, convention="sglang", num_layers=L).as_facts()
        facts.update(aux_native_ids=res["aux_native_ids"], aux_convention=res["aux_convention"])
    # ... and what the target really captures (never the configured ids in its place): SGLang sets
    # it after this point (init_attention_backends); Recorder.refresh fills it in.
    facts.update({"aux_hf_indices": UNKNOWN, "aux_dropped_ids": UNKNOWN, AUX_CONCAT_ORDER: UNKNOWN})
    dmodel = _chain(A, draft_runner, "ModelRunner.model")
    dinner = _chain(A, dmodel, "LlamaForCausalLMEagle3.model")
    nbf = _chain(A, dinner, "Eagle3LlamaModel.norm_before_fc")
    facts["norm_before_fc"] = UNKNOWN if nbf is MISSING else bool(nbf)
    fcn = _chain(A, dinner, "Eagle3LlamaModel.fc_norm")
    facts["fc_norm"] = UNKNOWN if fcn is MISSING else fcn is not None
    hot = hot_token_id(dw, A)
    if hot is MISSING:
        facts.update(hot_token_id_sha256=UNKNOWN, d2t_sha256=UNKNOWN, draft_vocab_size=UNKNOWN)
    elif hot is not None:
        facts["hot_token_id_sha256"] = sha256_array(hot)
        facts["d2t_sha256"] = sha256_array(hot - torch.arange(hot.numel(), dtype=torch.int64))
        facts["draft_vocab_size"] = int(hot.numel())
    else:
        facts["hot_token_id_sha256"] = None
        facts["d2t_sha256"] = None
        facts["draft_vocab_size"] = _cfg(dcfg, "draft_vocab_size", "draft_vocab_size", "draft")
        if facts["draft_vocab_size"] is None:  # SGLang sets it to vocab_size when absent (llama_eagle3.py:306)
            facts["draft_vocab_size"] = _cfg(dcfg, "vocab_size", "draft_vocab_size", "draft")
    for fact, key in (("spec_steps", "EagleDraftWorker.speculative_num_steps"), ("spec_topk", "EagleDraftWorker.topk"),
                      ("spec_draft_tokens", "EagleDraftWorker.speculative_num_draft_tokens")):
        facts[fact] = A.fact(dw, key, int)
    sa = A.get(dw, "EagleDraftWorker.server_args")
    facts["model_name"] = UNKNOWN if sa is MISSING else A.fact(sa, "ServerArgs.model_path", lambda v: str(v or ""))
    facts["draft_name"] = UNKNOWN if sa is MISSING else A.fact(
        sa, "ServerArgs.speculative_draft_model_path", lambda v: str(v or ""))
    # Set after EagleDraftWorker._capture_cuda_graphs (start-up, before any request); unknown until then.
    facts["graph_hidden_stages"] = UNKNOWN
    algo = _chain(A, dw, "EagleDraftWorker.speculative_algorithm")
    facts["spec_algorithm"] = UNKNOWN if algo is MISSING else str(getattr(algo, "name", algo))
    nout = _chain(A, dinner, "Eagle3LlamaModel.norm_output")
    facts["norm_output"] = UNKNOWN if nout is MISSING else bool(nout)
    facts.update(_weights_facts(A, target_runner=target_runner, dmodel=dmodel, dinner=dinner,
                                vocab=facts["vocab_size"], draft_vocab=facts["draft_vocab_size"]))
    facts.update(_rope_facts(A, dinner))
    facts.update(_tokenizer_facts(A, serving_config(A) if serving is None else serving))
    facts["depth_coverage"] = ("SGLang drafts depths >= 1 only from the last accepted position of each decode "
                               "step (t = L-1, eagle_worker_v2.py draft); every other position has depth-0 "
                               "rows only")
    facts["unobservable"] = A.unobservable()
    return facts


# ---- attribution (writer thread) ------------------------------------------------------------
# Rows come from the server's batch metadata (prefix/extend lengths, accept index, draft tree),
# not from a [B, T] layout, so only the per-name gathering (tracer.rows.RowBatch) is shared with
# the training-side row builder; the logits were already reduced on the device in the hot path.
def _seq(rec: Recorder, tw, rid: str, prompt: list[int] | None = None) -> int:
    if rid not in rec.seq_ids:
        toks = list(prompt or [])
        rec.seq_tokens[rid] = toks
        rec.seq_prompt[rid] = len(toks)
        rec.seq_ids[rid] = tw.add_sequence(np.asarray(toks, np.int32), prompt_len=len(toks), rid=rid)
    return rec.seq_ids[rid]


def _add_aux(rec: Recorder, out: RowBatch, aux_rows, seq, pos, it) -> None:
    out.add("target.aux_cat", aux_rows, seq=seq, pos=pos, depth=0, iter=it)
    H = rec.hidden_size
    K = rec.num_aux
    if H and aux_rows.shape[-1] % H == 0:
        K = aux_rows.shape[-1] // H
    if not K:
        return
    for j, chunk in enumerate(aux_rows.chunk(K, dim=-1)):
        out.add(f"target.aux.{j}", chunk.contiguous(), seq=seq, pos=pos, depth=0, iter=it)


def _add_draft_rows(rec: Recorder, out: RowBatch, df: DraftForward, sel, seq, pos, depth, it,
                    *, has_logits=True, lsel=None, tokens=True) -> None:
    """Add the draft tensors of rows ``sel`` (inputs, fc, midlayer taps) and ``lsel`` (logits;
    hidden_out too when the final-norm tap did not record it). ``tokens=False`` leaves out the
    input tokens (see ``_branch_order``)."""
    lsel = sel if lsel is None else lsel
    if df.input_ids is not None and tokens:
        out.add("tokens", df.input_ids[sel], seq=seq, pos=pos, depth=depth, iter=it)
    if df.fc_out is not None and df.fc_out.shape[0] == df.input_ids.shape[0]:
        out.add("draft.fc_in", df.fc_in[sel], seq=seq, pos=pos, depth=depth, iter=it)
        out.add("draft.fc_out", df.fc_out[sel], seq=seq, pos=pos, depth=depth, iter=it)
    n = df.input_ids.shape[0] if df.input_ids is not None else None
    for name, t in df.stages.items():
        if t.shape[0] == n:  # the taps see the forward's rows in input_ids order
            out.add(name, (t.to(torch.int64) if name == "draft.positions" else t)[sel], seq=seq, pos=pos,
                    depth=depth, iter=it)
    if not has_logits:
        return
    lpos, ldepth = pos, depth
    if df.hidden is not None and "draft.hidden_out" not in df.stages:
        out.add("draft.hidden_out", df.hidden[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
    if df.lt_values is not None:
        out.add("draft.logits_topk.values", df.lt_values[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
        out.add("draft.logits_topk.ids", df.lt_ids[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
        out.add("draft.logsumexp", df.lse[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)
    if df.logits is not None:
        out.add("draft.logits", df.logits[lsel], seq=seq, pos=lpos, depth=ldepth, iter=it)


def _parents(next_token: np.ndarray, next_sibling: np.ndarray) -> np.ndarray:
    n = next_token.shape[0]
    par = np.full(n, -1, np.int64)
    for j in range(n):
        c = int(next_token[j])
        guard = 0
        while 0 <= c < n and guard <= n:
            par[c] = j
            c = int(next_sibling[c])
            guard += 1
    return par


def write_capture(rec: Recorder, tw, cap: IterCapture) -> None:
    """Attribute one iteration's captured tensors and append them (writer thread)."""
    out = RowBatch()
    touched: set[str] = set()
    if cap.kind == "prefill":
        _write_prefill(rec, tw, cap, out, touched)
    else:
        _write_decode(rec, tw, cap, out, touched)
    # Tokens before rows: a killed server's trace ends at any journal write, and a target row at
    # t must never be on disk without the token x_{t+1} it is compared against.
    for rid in touched:
        toks = rec.seq_tokens[rid]
        tw.add_sequence(np.asarray(toks, np.int32), prompt_len=rec.seq_prompt[rid], rid=rid,
                        seq_id=rec.seq_ids[rid])
    out.flush(tw)


def _write_prefill(rec, tw, cap, out, touched) -> None:
    aux = cap.t.get("target_aux")
    nti = cap.t.get("next_token_ids")
    de = next((d for d in cap.draft if d.mode == "extend"), None)
    de_topk = cap.t.get("de_topk_index")
    off = 0
    for b, rid in enumerate(cap.rids):
        p, e = cap.prefix_lens[b], cap.extend_lens[b]
        rows = slice(off, off + e)
        off += e
        if not rec.keep_rid(rid):
            continue
        sid = _seq(rec, tw, rid, cap.prompts.get(rid))
        pos = np.arange(p, p + e)
        prompt_len = rec.seq_prompt[rid]
        final = p + e >= prompt_len
        if aux is not None:
            _add_aux(rec, out, aux[rows], sid, pos, -1)
        last = p + e - 1
        if final and nti is not None:
            tok = int(nti[b])
            out.add("target.argmax", torch.tensor([tok]), seq=sid, pos=last, depth=0, iter=-1)
            toks = rec.seq_tokens[rid]
            if len(toks) == last + 1:
                toks.append(tok)
                touched.add(rid)
        if de is not None:
            _add_draft_rows(rec, out, de, rows, sid, pos, 0, -1, has_logits=False)
            if final:
                tapped = "draft.hidden_out" in de.stages  # then every row's hidden_out is in already
                _add_draft_rows(rec, out, DraftForward(mode="extend", hidden=None if tapped else de.hidden,
                                                       lt_values=de.lt_values,
                                                       lt_ids=de.lt_ids, lse=de.lse, logits=de.logits),
                                slice(b, b + 1), sid, last, 0, -1)
        if final and de_topk is not None:
            out.add("draft.topk", de_topk[b:b + 1], seq=sid, pos=last, depth=0, iter=-1)


def _write_decode(rec, tw, cap, out, touched) -> None:
    t = cap.t
    bs = len(cap.rids)
    L = t["seq_lens"].to(torch.int64).numpy()
    it = cap.iter
    predict = t.get("predict")
    acc_len = t.get("accept_lens")
    acc_idx = t.get("accept_index")
    if predict is None or acc_len is None or acc_idx is None:
        return
    predict = predict.to(torch.int64)
    acc_len = acc_len.to(torch.int64).numpy()
    acc_idx = acc_idx.to(torch.int64).view(bs, -1)
    N = predict.shape[0] // bs
    slots = acc_idx.shape[1]
    k = rec.topk
    aux = t.get("target_aux")
    vpos = t.get("verify_positions")
    dt = t.get("draft_token")
    rindex = t.get("retrieve_index")
    nxt, sib = t.get("retrieve_next_token"), t.get("retrieve_next_sibling")
    de = next((d for d in cap.draft if d.mode == "extend_v2"), None)
    de_topk = t.get("de_topk_index")
    steps = [d for d in cap.draft if d.mode == "decode"]
    for b, rid in enumerate(cap.rids):
        if not rec.keep_rid(rid):
            continue
        sid = _seq(rec, tw, rid)
        Lb, a = int(L[b]), int(acc_len[b])
        gidx = acc_idx[b, :a]
        local = acc_idx[b].clone()
        local[local >= 0] -= b * N
        accepted = torch.full((slots,), -1, dtype=torch.int64)
        accepted[:a] = predict[gidx]
        # verify rows
        out.add("verify.accept_length", torch.tensor([a]), seq=sid, pos=Lb, depth=0, iter=it)
        out.add("verify.accept_index", local[None], seq=sid, pos=Lb, depth=0, iter=it)
        out.add("verify.accepted_tokens", accepted[None], seq=sid, pos=Lb, depth=0, iter=it)
        out.add("verify.predict", predict[b * N:(b + 1) * N][None], seq=sid, pos=Lb, depth=0, iter=it)
        if dt is not None:
            out.add("verify.draft_tokens", dt.view(bs, -1)[b][None], seq=sid, pos=Lb, depth=0, iter=it)
        if rindex is not None:
            ri = rindex.to(torch.int64).view(bs, -1)[b].clone()
            ri[ri >= b * N] -= b * N
            out.add("verify.retrieve_index", ri[None], seq=sid, pos=Lb, depth=0, iter=it)
        if nxt is not None and sib is not None:
            nt = nxt.to(torch.int64).view(bs, -1)[b].numpy()
            ns = sib.to(torch.int64).view(bs, -1)[b].numpy()
            out.add("verify.parents", torch.as_tensor(_parents(nt, ns))[None], seq=sid, pos=Lb, depth=0, iter=it)
        # accepted target rows: positions of the accepted nodes
        pos = (vpos.to(torch.int64)[gidx].numpy() if vpos is not None else Lb + np.arange(a))
        if aux is not None and aux.shape[0] == bs * N:
            _add_aux(rec, out, aux[gidx], sid, pos, it)
        out.add("target.argmax", predict[gidx], seq=sid, pos=pos, depth=0, iter=it)
        # committed tokens
        toks = rec.seq_tokens[rid]
        if len(toks) == Lb + 1:
            toks.extend(int(x) for x in predict[gidx])
            touched.add(rid)
        # draft extend (accepted path is at the front of the request's block), depth 0
        if de is not None and de.input_ids is not None and de.input_ids.shape[0] == bs * N:
            rows = slice(b * N, b * N + a)
            dpos = Lb + np.arange(a)
            _add_draft_rows(rec, out, de, rows, sid, dpos, 0, it)
        if de_topk is not None:
            out.add("draft.topk", de_topk[b:b + 1], seq=sid, pos=Lb + a - 1, depth=0, iter=it)
        # draft steps of this iteration, continuing from the row at L-1
        orders = _branch_order(cap, steps, b, k, committed=predict[gidx])
        for i, df in enumerate(steps):
            perm, on_path = orders[i + 1]
            rows = b * k + perm
            _add_draft_rows(rec, out, df, rows, sid, Lb - 1, i + 1, it, tokens=on_path)
            if df.topk_ids is not None:
                out.add("draft.topk", df.topk_ids[rows], seq=sid, pos=Lb - 1, depth=i + 1, iter=it)
        for i, ids in cap.select:
            ids = ids.reshape(-1, k)
            per = ids.shape[0] // bs
            perm = orders[i][0] if per == k and i in orders else torch.arange(per)
            out.add("draft.topk_target", ids[b * per + perm], seq=sid, pos=Lb - 1, depth=i, iter=it)


def _branch_order(cap: IterCapture, steps: list, b: int, k: int, *, committed) -> dict[int, tuple]:
    """Row order of request ``b``'s topk branches at each draft depth d >= 1: ``{d: (perm, on_path)}``.

    The diff pairs a (seq, pos, depth) key by its first row and compares depth d only where the
    first rows' input tokens equal the teacher-forced tokens at every depth 0..d. That is sound
    only if the first rows form ONE draft path, so the first row at depth d is a child of the first
    row at depth d-1 (SGLang spec_utils.py ``_select_top_k_tokens_later``: the parent of row r of
    step i is ``(tree_info[2][r] - (k*k*(i-1) + k)) // k``; every row of step 0 descends from the
    draft-extend row). Among the children, the one whose token is the committed token
    ``committed[d-1]`` (x_{L+d}) goes first, else SGLang's best-scored. When no child survived
    SGLang's top-k, the path ends: from that depth on ``on_path`` is False and the rows are written
    without ``tokens``, so the diff does not compare them against the teacher-forced path.
    Depth 0 (one row per request) gets ``(arange(1), True)``.
    """
    orders: dict[int, tuple] = {0: (torch.arange(1), True)}
    first, on_path = 0, True
    for i, df in enumerate(steps):
        d = i + 1
        par = cap.branch_parents.get(i)
        if k == 1:  # a chain: one row per depth, one path
            orders[d] = (torch.arange(1), on_path)
            continue
        if df.input_ids is None or (i > 0 and par is None):  # parents unknown: no path can be claimed
            on_path = False
        if on_path:
            parent = (torch.zeros(k, dtype=torch.int64) if i == 0
                      else (par.to(torch.int64).view(-1, k)[b] - (k * k * (i - 1) + k)) // k)
            children = [r for r in range(k) if int(parent[r]) == first]
            on_path = bool(children)
        if not on_path:
            orders[d] = (torch.arange(k), False)
            continue
        ids = df.input_ids[b * k:(b + 1) * k].to(torch.int64)
        teacher = int(committed[i]) if i < len(committed) else None
        pick = next((r for r in children if int(ids[r]) == teacher), children[0])
        orders[d] = (torch.tensor([pick] + [r for r in range(k) if r != pick]), True)
        first = pick
    return orders
