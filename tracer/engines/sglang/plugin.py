"""specdiff's SGLang general plugin: record an EAGLE-3 trace from a live server, no SGLang edits.

Declared in pyproject as ``[project.entry-points."sglang.srt.plugins"] specdiff``; SGLang's
``load_plugins()`` calls ``load()`` in every process it starts. ``load()`` does nothing unless
``SPECDIFF_TRACE=<store path>`` is set, and registers hooks only in the scheduler process of
TP rank 0 (the other TP ranks run the same batch and hold the same all-reduced hidden states and
all-gathered logits, so their tensors add nothing); with data parallelism (``--dp-size N``) every
replica r writes its own store ``<SPECDIFF_TRACE>/dp<r>``, and ``open_trace(<SPECDIFF_TRACE>)``
reads them as one trace (tracer/store/ranks.py). With DP attention only attention-DP group 0 (global
TP rank 0) records.

Environment:
    SPECDIFF_TRACE        trace store path (must not exist yet)
    SPECDIFF_CAPTURE      ``default`` (draft logits as top-k + logsumexp) or ``full`` (full logits)
    SPECDIFF_LOGITS_TOPK  k of ``draft.logits_topk.*`` (default 8)
    SPECDIFF_RIDS         regex; record only requests whose rid matches
    SPECDIFF_EAGER_DRAFT  ``1``: do not capture the draft's CUDA graphs, so every draft stage is
                          recorded (the target keeps its graphs)
    SPECDIFF_MAX_QUEUE_MB host memory the writer queue may hold (default 2048); iterations beyond
                          it are dropped and counted in the contract's ``dropped_records``
    SPECDIFF_WEIGHT_FACTS ``0``: no checkpoint fingerprints on the load path (contract weight facts
                          unknown; benchmarks/contract_startup.py measures what they cost)

Hooks (HookRegistry, targets under ``sglang.srt.``) and what they record are described in
tracer/engines/sglang/hooks.py; the SGLang 0.5.23 side they follow is its one V2 worker
(srt/speculative/eagle_worker_v2.py: ``EAGLEWorkerV2`` :1297 and ``EagleDraftWorker`` :177, the prefill's
target forward capturing the aux concat in ``_forward_prefill_batch`` :1548). The trace
is closed at process exit (atexit and SIGTERM); every append is journaled at once, so the trace
of a killed server opens too.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import time

from specdiff.tracer.engines import target_logits
from specdiff.tracer.engines.lifecycle import close_on_sigterm
from specdiff.tracer.engines.names import MISSING
from specdiff.tracer.engines.sglang.adapter import BY_KEY, SGLangAdapter, hook_table

logger = logging.getLogger("specdiff.tracer")

#: hook target -> (HookType name, hook function name in this module); declared in adapter.
HOOKS: dict[str, tuple[str, str]] = hook_table()
EAGER_HOOKS: dict[str, tuple[str, str]] = {t: h for t, h in hook_table(eager_draft=True).items() if t not in HOOKS}

_SCHEDULER_FN = BY_KEY["scheduler.run_scheduler_process"].attr
_rec = None  # hooks.Recorder, set by load()


def _scheduler_frame():
    """The ``run_scheduler_process`` frame above us, or None (other SGLang processes)."""
    f = sys._getframe(1)
    for _ in range(30):
        if f is None:
            return None
        if f.f_code.co_name == _SCHEDULER_FN:
            return f
        f = f.f_back
    return None


def load(env=None) -> bool:
    """SGLang plugin entry point. Returns True when recording hooks were registered.

    In the scheduler process of TP rank 0 it checks the running SGLang's version (warns once
    outside ``EngineSpec.tested_range``) and every SGLang name the recorder declares
    (one warning line per missing name, naming what becomes unobservable); tracing is refused
    only when a name without which nothing can be recorded is missing.
    """
    global _rec
    env = os.environ if env is None else env
    from specdiff.tracer.engines.options import OptionError, Options
    from specdiff.tracer.engines.sglang.hooks import Recorder

    try:
        opts = Options.from_env(env)
    except OptionError as exc:
        if _scheduler_frame() is not None:  # one line per scheduler, not per process that loads plugins
            logger.error("specdiff: tracing refused: %s; the server runs untraced", exc)
        return False
    if opts is None:
        return False
    frame = _scheduler_frame()
    if frame is None:
        return False  # main process, detokenizer, DP controller: nothing to record there
    # SGLang 0.5.23 scheduler.py:6310 run_scheduler_process(server_args, port_args, gpu_id, tp_rank,
    # pp_rank, dp_rank, ...): the adapter checks these parameter names at load (kind "param").
    tp_rank = frame.f_locals.get("tp_rank", 0)
    dp_rank = frame.f_locals.get("dp_rank")
    del frame
    if tp_rank not in (0, None):
        return False
    # SGLang 0.5.23 passes dp_rank=None when one replica serves (entrypoints/engine.py:945-953) and
    # an int, 0 included, to every replica the data-parallel controller starts
    # (managers/data_parallel_controller.py:772-800): then one store per replica under the path,
    # opened together as one trace (tracer/store/ranks.py).
    if isinstance(dp_rank, int):
        opts.path = os.path.join(opts.path, f"dp{dp_rank}")

    if _rec is not None:
        return True
    adapter = SGLangAdapter.for_running()
    adapter.check_version()
    missing = {n.key for n in adapter.check_static(eager_draft=opts.eager_draft)}
    essential = [n.key for n in adapter.names if n.essential and n.key in missing]
    if essential:
        logger.error("specdiff: tracing refused: SGLang %s lacks %s, without which nothing can be "
                     "recorded; the server runs untraced", adapter.version, ", ".join(essential))
        return False
    if os.path.exists(opts.path):
        logger.error("specdiff: tracing refused: %s already exists; choose a new SPECDIFF_TRACE path",
                     opts.path)
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _rec = Recorder(opts, adapter)
    mod = sys.modules[__name__]
    hooks = {**HOOKS, **(EAGER_HOOKS if opts.eager_draft else {})}
    targets = {n.target: n.key for n in adapter.names if n.kind == "hook"}
    for target, (htype, fname) in hooks.items():
        if targets.get(target) in missing:
            continue  # logged by the adapter with the tensors this hook would have recorded
        HookRegistry.register(target, getattr(mod, fname), HookType[htype])
    atexit.register(_close)
    _install_sigterm()
    logger.info("specdiff: EAGLE-3 tracing armed (trace %s, capture %s)", opts.path, opts.capture)
    return True


def _close(*_a) -> None:
    if _rec is not None:
        _rec.close()


def _install_sigterm() -> None:
    close_on_sigterm(_close)


# ---- hook functions (thin: every failure disables recording, never the server) -------------
def _timed(fn):
    """Add the hook's own wall time to the recorder's ``hook_s`` (AFTER hooks only)."""
    import functools
    import time

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            rec = _rec
            if rec is not None:
                rec.hook_s += time.perf_counter() - t0

    return wrapper


def _live():
    rec = _rec
    if rec is None or not rec.active:
        return None
    from specdiff.tracer.engines.sglang.hooks import _capturing

    if _capturing():
        return None
    return rec


def _after_draft_alloc(result, self, *a, **kw):
    """Start-up: the contract is written before any request (so a server that crashes on its
    first request still leaves one)."""
    rec = _live()
    if rec is not None:
        try:
            rec.start(self)
        except Exception as exc:  # noqa: BLE001
            rec.fail("EagleDraftWorker.alloc_memory_pool", exc)
    return None


def _around_load_weights(orig, model, weights, *a, **kw):
    """Start-up, once per model (target, then draft): fingerprint the checkpoint tensors SGLang's
    iterator yields and note the parameters the loading left as allocated (tracer/weight_facts.py
    ``LoadWatch``); kept on the recorder by ``id(model)`` until the contract is read."""
    rec = _rec
    if rec is None or not rec.enabled or not rec.opts.weight_facts:
        return orig(model, weights, *a, **kw)
    try:
        from specdiff.tracer.weight_facts import LoadWatch

        watch = LoadWatch(model)
    except Exception as exc:  # noqa: BLE001 - the facts become unknown, the load goes on
        logger.warning("specdiff: the load path of %s is not watched (%s: %s); its weight facts are unknown",
                       type(model).__name__, type(exc).__name__, exc)
        return orig(model, weights, *a, **kw)
    with watch:
        out = orig(model, watch.wrap(weights), *a, **kw)
    try:
        watch.finish()  # before SGLang's post-processing repacks the weights
        rec.loads[id(model)] = watch
    except Exception as exc:  # noqa: BLE001
        logger.warning("specdiff: the parameters %s's loading wrote could not be read (%s: %s); its weight "
                       "facts are unknown", type(model).__name__, type(exc).__name__, exc)
    return out


def _around_iteration(orig, self, batch, *a, **kw):
    rec = _live()
    cap = None
    t0 = time.perf_counter()
    if rec is not None:
        try:
            if rec.writer is None:
                dw = rec.adapter.get(self, "BaseSpecWorker.draft_worker")
                if dw is not MISSING:
                    rec.start(dw)
            cap = rec.begin(batch)
        except Exception as exc:  # noqa: BLE001
            rec.fail("forward_batch_generation (begin)", exc)
            cap = None
        rec.in_iteration, rec.phase = True, None
    rec_ = rec if cap is not None else None
    if rec_ is not None:
        rec_.cur = cap
    t1 = time.perf_counter()
    try:
        result = orig(self, batch, *a, **kw)
    except Exception as exc:
        if rec is not None and rec.writer is not None:
            rec.crashed(exc, cap)
        raise
    finally:
        if rec is not None:
            rec.in_iteration = False
        if rec_ is not None:
            rec_.cur = None
    t2 = time.perf_counter()
    if rec_ is not None and rec_.active:
        rec_.finish_or_fail(cap, result, "forward_batch_generation (finish)")
    if rec is not None:
        t3 = time.perf_counter()
        rec.hook_s += (t1 - t0) + (t3 - t2)
        rec.iter_s += t3 - t0
    return result


def read_chain(adapter, obj, *keys):
    from specdiff.tracer.engines.sglang.reading import read_chain as chain

    return chain(adapter, obj, *keys)


def _cur():
    rec = _live()
    if rec is None or rec.cur is None:
        return None, None
    return rec, rec.cur


@_timed
def _after_target_forward(result, self, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        A = rec.adapter
        lo = A.get(result, "GenerationBatchResult.logits_output")
        hs = None if lo is None or lo is MISSING else A.get(lo, "LogitsProcessorOutput.hidden_states")
        if hs is not None and hs is not MISSING and "target_aux" not in cap.t:
            cap.t["target_aux"] = rec.snap(hs)
        if lo is not None and lo is not MISSING:
            target_logits.stage(rec, cap.t, A.get(lo, "LogitsProcessorOutput.next_token_logits"),
                                rec.opts.logits_topk)
        nti = A.get(result, "GenerationBatchResult.next_token_ids") if cap.kind == "prefill" else None
        if nti is not None and nti is not MISSING:
            cap.t["next_token_ids"] = rec.snap(nti)
    except Exception as exc:  # noqa: BLE001
        rec.fail("TpModelWorker.forward_batch_generation", exc)
    return None


_MODES = {"EXTEND": "extend", "DRAFT_EXTEND_V2": "extend_v2", "DECODE": "decode"}


def _around_runner_forward(orig, self, forward_batch, *a, **kw):
    rec = _live()
    if rec is None or not rec.in_iteration:
        return orig(self, forward_batch, *a, **kw)
    from specdiff.tracer.crash import forward_name

    A = rec.adapter
    is_draft = A.get(self, "ModelRunner.is_draft_worker") is True
    fmode = A.get(forward_batch, "ForwardBatch.forward_mode")
    mname = None if fmode is MISSING else fmode.name
    prev = rec.phase
    # Which forward is running, for the crash record (its shapes only: no tensor is touched).
    ids = A.get(forward_batch, "ForwardBatch.input_ids")
    pos = A.get(forward_batch, "ForwardBatch.positions")
    rec.phase = (forward_name(is_draft=is_draft, mode=mname),
                 {k: list(v.shape) for k, v in (("input_ids", ids), ("positions", pos)) if hasattr(v, "shape")})
    cap = rec.cur
    mode = _MODES.get(mname or "") if is_draft else None
    if cap is None or mode is None:
        out = orig(self, forward_batch, *a, **kw)
        rec.phase = prev  # only on success: a forward that raised stays named
        return out
    t0 = time.perf_counter()
    taps = rec.stage_taps
    try:
        model = A.get(self, "ModelRunner.model")
        if model is not MISSING:
            rec.ensure_fc_hook(model)
            taps.attach(model)
        rec.fc_sink = []
        taps.open()
    except Exception as exc:  # noqa: BLE001
        rec.fail("draft ModelRunner.forward (before)", exc)
    t1 = time.perf_counter()
    try:
        out = orig(self, forward_batch, *a, **kw)
    except BaseException:
        rec.fc_sink = None
        taps.close()
        raise
    rec.phase = prev
    t2 = time.perf_counter()
    rec.hook_s += t1 - t0
    try:
        stages = taps.close()
        if rec.active and rec.cur is cap:
            lo = A.get(out, "ModelRunnerOutput.logits_output")
            if lo is not MISSING:
                df = rec.capture_draft_forward(mode, forward_batch, lo)
                df.stages = stages
                cap.draft.append(df)
    except Exception as exc:  # noqa: BLE001
        rec.fail("draft ModelRunner.forward", exc)
    finally:
        rec.fc_sink = None
        rec.hook_s += time.perf_counter() - t2
    return out


@_timed
def _after_de_prefill(result, self, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        topk = rec.adapter.get(result, "EagleDraftInput.topk_index")
        if topk is not MISSING:
            cap.t["de_topk_index"] = rec.snap(topk)
    except Exception as exc:  # noqa: BLE001
        rec.fail("_draft_extend_for_prefill", exc)
    return None


@_timed
def _after_de_decode(result, self, batch, batch_result, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        topk = read_chain(rec.adapter, batch_result, "GenerationBatchResult.next_draft_input",
                      "EagleDraftInput.topk_index")
        if topk is not MISSING:
            cap.t["de_topk_index"] = rec.snap(topk)
    except Exception as exc:  # noqa: BLE001
        rec.fail("_draft_extend_for_decode", exc)
    return None


@_timed
def _after_select_top_k(result, i, topk_p, topk_index, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        cap.select.append((int(i), rec.snap(topk_index)))
        if int(i) > 0 and rec.topk > 1:  # tree_info[2]: each row's parent (attribution._branch_order)
            cap.branch_parents[int(i)] = rec.snap(result[3][2])
    except Exception as exc:  # noqa: BLE001
        rec.fail("select_top_k_tokens", exc)
    return None


@_timed
def _after_build_verify(result, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        for key, name in (("draft_token", "EagleVerifyInput.draft_token"),
                          ("verify_positions", "EagleVerifyInput.positions"),
                          ("retrieve_index", "EagleVerifyInput.retrieve_index"),
                          ("retrieve_next_token", "EagleVerifyInput.retrieve_next_token"),
                          ("retrieve_next_sibling", "EagleVerifyInput.retrieve_next_sibling")):
            v = rec.adapter.get(result, name)
            if v is not None and v is not MISSING:
                cap.t[key] = rec.snap(v)
    except Exception as exc:  # noqa: BLE001
        rec.fail("build_eagle_verify_input", exc)
    return None


@_timed
def _after_eagle_sample(result, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        predict, accept_lens, accept_index = result[:3]
        cap.t["predict"] = rec.snap(predict)
        cap.t["accept_lens"] = rec.snap(accept_lens)
        cap.t["accept_index"] = rec.snap(accept_index)
    except Exception as exc:  # noqa: BLE001
        rec.fail("eagle_sample", exc)
    return None


def _after_capture_graphs(result, self, *a, **kw):
    """After the draft's CUDA graphs are captured: record which stages they hide; with
    SPECDIFF_EAGER_DRAFT=1 drop them first, so every draft stage runs eagerly."""
    rec = _rec
    if rec is None:
        return None
    if rec.opts.eager_draft:
        # SGLang 0.5.23 eagle_worker_v2.py:478-479 (the names the adapter declares)
        self.cuda_graph_runner = None
        self.cuda_graph_runner_for_draft_extend = None
        logger.info("specdiff: draft CUDA graphs disabled while tracing (SPECDIFF_EAGER_DRAFT=1)")
    try:
        rec.refresh(self)
    except Exception as exc:  # noqa: BLE001
        rec.fail("EagleDraftWorker._capture_cuda_graphs", exc)
    return None
