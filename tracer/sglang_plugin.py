"""specdiff's SGLang general plugin: record an EAGLE-3 trace from a live server, no SGLang edits.

Declared in pyproject as ``[project.entry-points."sglang.srt.plugins"] specdiff``; SGLang's
``load_plugins()`` calls ``load()`` in every process it starts. ``load()`` does nothing unless
``SPECDIFF_TRACE=<store path>`` is set, and registers hooks only in the scheduler process of
TP rank 0 (the one that runs the EAGLE worker and sees gathered logits / broadcast samples);
data-parallel replica r > 0 writes ``<SPECDIFF_TRACE>.dp<r>``.

Environment:
    SPECDIFF_TRACE        trace store path (must not exist yet)
    SPECDIFF_CAPTURE      ``default`` (draft logits as top-k + logsumexp) or ``full`` (full logits)
    SPECDIFF_LOGITS_TOPK  k of ``draft.logits_topk.*`` (default 8)
    SPECDIFF_RIDS         regex; record only requests whose rid matches
    SPECDIFF_EAGER_DRAFT  ``1``: do not capture the draft's CUDA graphs, so every draft stage is
                          recorded (the target keeps its graphs)
    SPECDIFF_MAX_QUEUE_MB host memory the writer queue may hold (default 2048); iterations beyond
                          it are dropped and counted in the contract's ``dropped_records``

Hooks (HookRegistry, targets under ``sglang.srt.``) and what they record are described in
tracer/sglang_hooks.py; shared/research/sglang-eagle3-dataflow.md has the SGLang side. The trace
is closed at process exit (atexit and SIGTERM); every append is journaled at once, so the trace
of a killed server opens too.
"""

from __future__ import annotations

import atexit
import logging
import os
import pkgutil
import signal
import sys
import time

logger = logging.getLogger("specdiff.tracer")

_P = "sglang.srt."
#: hook target -> (HookType name, hook function name in this module)
HOOKS: dict[str, tuple[str, str]] = {
    _P + "speculative.eagle_worker_v2.EAGLEWorkerV2.__init__": ("AFTER", "_after_worker_init"),
    _P + "speculative.eagle_worker_v2.EAGLEWorkerV2.forward_batch_generation": ("AROUND", "_around_iteration"),
    _P + "managers.tp_worker.TpModelWorker.forward_batch_generation": ("AFTER", "_after_target_forward"),
    _P + "model_executor.model_runner.ModelRunner.forward": ("AROUND", "_around_runner_forward"),
    _P + "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_prefill": ("AFTER", "_after_de_prefill"),
    _P + "speculative.eagle_worker_v2.EagleDraftWorker._draft_extend_for_decode": ("AFTER", "_after_de_decode"),
    _P + "speculative.spec_utils.select_top_k_tokens": ("AFTER", "_after_select_top_k"),
    _P + "speculative.eagle_worker_common.build_eagle_verify_input": ("AFTER", "_after_build_verify"),
    _P + "speculative.eagle_utils.eagle_sample": ("AFTER", "_after_eagle_sample"),
}
EAGER_HOOK = (_P + "speculative.eagle_worker_v2.EagleDraftWorker._capture_cuda_graphs", "AFTER",
              "_after_capture_graphs")

_rec = None  # sglang_hooks.Recorder, set by load()


def _scheduler_frame():
    """The ``run_scheduler_process`` frame above us, or None (other SGLang processes)."""
    f = sys._getframe(1)
    for _ in range(30):
        if f is None:
            return None
        if f.f_code.co_name == "run_scheduler_process":
            return f
        f = f.f_back
    return None


def missing_targets(targets, reasons: dict | None = None) -> list[str]:
    """Hook targets that do not resolve in the installed SGLang (``reasons``: target -> error)."""
    bad = []
    for target in targets:
        obj_path, attr = target.rsplit(".", 1)
        try:
            obj = pkgutil.resolve_name(obj_path)
            getattr(obj, attr)
        except Exception as exc:  # noqa: BLE001
            bad.append(target)
            if reasons is not None:
                reasons[target] = f"{type(exc).__name__}: {exc}"
    return bad


def load(env=None) -> bool:
    """SGLang plugin entry point. Returns True when recording hooks were registered."""
    global _rec
    env = os.environ if env is None else env
    from .sglang_hooks import Options, Recorder

    opts = Options.from_env(env)
    if opts is None:
        return False
    frame = _scheduler_frame()
    if frame is None:
        return False  # main process, detokenizer, DP controller: nothing to record there
    tp_rank = frame.f_locals.get("tp_rank", 0)
    dp_rank = frame.f_locals.get("dp_rank")
    del frame
    if tp_rank not in (0, None):
        return False
    if isinstance(dp_rank, int) and dp_rank > 0:  # data-parallel replicas: one trace each
        opts.path = f"{opts.path.rstrip('/')}.dp{dp_rank}"

    if _rec is not None:
        return True
    targets = list(HOOKS) + ([EAGER_HOOK[0]] if opts.eager_draft else [])
    reasons: dict = {}
    bad = missing_targets(targets, reasons)
    if bad:
        try:
            import sglang

            ver = getattr(sglang, "__version__", "?")
        except Exception:  # noqa: BLE001
            ver = "?"
        logger.error("specdiff: tracing refused: SGLang %s lacks hook target(s) %s (first error: %s; "
                     "specdiff supports SGLang 0.5.23); the server runs untraced", ver, ", ".join(bad),
                     reasons.get(bad[0], "?"))
        return False
    if os.path.exists(opts.path):
        logger.error("specdiff: tracing refused: %s already exists; choose a new SPECDIFF_TRACE path",
                     opts.path)
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    _rec = Recorder(opts)
    mod = sys.modules[__name__]
    for target, (htype, fname) in HOOKS.items():
        HookRegistry.register(target, getattr(mod, fname), HookType[htype])
    if opts.eager_draft:
        HookRegistry.register(EAGER_HOOK[0], getattr(mod, EAGER_HOOK[2]), HookType[EAGER_HOOK[1]])
    atexit.register(_close)
    _install_sigterm()
    logger.info("specdiff: EAGLE-3 tracing armed (trace %s, capture %s)", opts.path, opts.capture)
    return True


def _close(*_a) -> None:
    if _rec is not None:
        _rec.close()


def _install_sigterm() -> None:
    try:
        prev = signal.getsignal(signal.SIGTERM)
    except (ValueError, OSError):
        return

    def _on_term(signum, frame):
        _close()
        if callable(prev) and prev not in (signal.SIG_IGN, signal.SIG_DFL):
            prev(signum, frame)
        elif prev != signal.SIG_IGN:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)

    try:
        signal.signal(signal.SIGTERM, _on_term)
    except (ValueError, OSError):  # not the main thread
        pass


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
    from .sglang_hooks import _capturing

    if _capturing():
        return None
    return rec


def _after_worker_init(result, self, *a, **kw):
    rec = _live()
    if rec is not None:
        try:
            rec.start(self)
        except Exception as exc:  # noqa: BLE001
            rec.fail("EAGLEWorkerV2.__init__", exc)
    return None


def _around_iteration(orig, self, batch, *a, **kw):
    rec = _live()
    cap = None
    t0 = time.perf_counter()
    if rec is not None:
        try:
            if rec.writer is None:
                rec.start(self)
            cap = rec.begin(batch)
        except Exception as exc:  # noqa: BLE001
            rec.fail("forward_batch_generation (begin)", exc)
            cap = None
    rec_ = rec if cap is not None else None
    if rec_ is not None:
        rec_.cur = cap
    t1 = time.perf_counter()
    try:
        result = orig(self, batch, *a, **kw)
    finally:
        if rec_ is not None:
            rec_.cur = None
    t2 = time.perf_counter()
    if rec_ is not None and rec_.active:
        try:
            rec_.finish(cap, result)
        except Exception as exc:  # noqa: BLE001
            rec_.fail("forward_batch_generation (finish)", exc)
    if rec is not None:
        t3 = time.perf_counter()
        rec.hook_s += (t1 - t0) + (t3 - t2)
        rec.iter_s += t3 - t0
    return result


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
        from .sglang_hooks import snap

        lo = getattr(result, "logits_output", None)
        hs = getattr(lo, "hidden_states", None)
        if hs is not None and "target_aux" not in cap.t:
            cap.t["target_aux"] = snap(hs)
        if cap.kind == "prefill" and getattr(result, "next_token_ids", None) is not None:
            cap.t["next_token_ids"] = snap(result.next_token_ids)
    except Exception as exc:  # noqa: BLE001
        rec.fail("TpModelWorker.forward_batch_generation", exc)
    return None


_MODES = {"EXTEND": "extend", "DRAFT_EXTEND_V2": "extend_v2", "DECODE": "decode"}


def _around_runner_forward(orig, self, forward_batch, *a, **kw):
    rec, cap = _cur()
    if cap is None or not getattr(self, "is_draft_worker", False):
        return orig(self, forward_batch, *a, **kw)
    mode = _MODES.get(getattr(forward_batch.forward_mode, "name", ""))
    if mode is None:
        return orig(self, forward_batch, *a, **kw)
    t0 = time.perf_counter()
    try:
        rec.ensure_fc_hook(self.model)
        rec.fc_sink = []
    except Exception as exc:  # noqa: BLE001
        rec.fail("draft ModelRunner.forward (before)", exc)
    t1 = time.perf_counter()
    try:
        out = orig(self, forward_batch, *a, **kw)
    except BaseException:
        rec.fc_sink = None
        raise
    t2 = time.perf_counter()
    rec.hook_s += t1 - t0
    try:
        if rec.active and rec.cur is cap:
            cap.draft.append(rec.capture_draft_forward(mode, forward_batch, out.logits_output))
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
        from .sglang_hooks import snap

        cap.t["de_topk_index"] = snap(result.topk_index)
    except Exception as exc:  # noqa: BLE001
        rec.fail("_draft_extend_for_prefill", exc)
    return None


@_timed
def _after_de_decode(result, self, batch, batch_result, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        from .sglang_hooks import snap

        cap.t["de_topk_index"] = snap(batch_result.next_draft_input.topk_index)
    except Exception as exc:  # noqa: BLE001
        rec.fail("_draft_extend_for_decode", exc)
    return None


@_timed
def _after_select_top_k(result, i, topk_p, topk_index, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        from .sglang_hooks import snap

        cap.select.append((int(i), snap(topk_index)))
    except Exception as exc:  # noqa: BLE001
        rec.fail("select_top_k_tokens", exc)
    return None


@_timed
def _after_build_verify(result, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        from .sglang_hooks import snap

        for key, attr in (("draft_token", "draft_token"), ("verify_positions", "positions"),
                          ("retrieve_index", "retrieve_index"),
                          ("retrieve_next_token", "retrieve_next_token"),
                          ("retrieve_next_sibling", "retrieve_next_sibling")):
            v = getattr(result, attr, None)
            if v is not None:
                cap.t[key] = snap(v)
    except Exception as exc:  # noqa: BLE001
        rec.fail("build_eagle_verify_input", exc)
    return None


@_timed
def _after_eagle_sample(result, *a, **kw):
    rec, cap = _cur()
    if cap is None:
        return None
    try:
        from .sglang_hooks import snap

        predict, accept_lens, accept_index = result[:3]
        cap.t["predict"] = snap(predict)
        cap.t["accept_lens"] = snap(accept_lens)
        cap.t["accept_index"] = snap(accept_index)
    except Exception as exc:  # noqa: BLE001
        rec.fail("eagle_sample", exc)
    return None


def _after_capture_graphs(result, self, *a, **kw):
    """SPECDIFF_EAGER_DRAFT=1: drop the draft's CUDA graphs so every draft stage runs eagerly."""
    self.cuda_graph_runner = None
    self.cuda_graph_runner_for_draft_extend = None
    logger.info("specdiff: draft CUDA graphs disabled while tracing (SPECDIFF_EAGER_DRAFT=1)")
    return None
