"""specdiff's vLLM general plugin: record an EAGLE-3 trace from a live vLLM, no vLLM edits.

Declared in pyproject as ``[project.entry-points."vllm.general_plugins"] specdiff``; vLLM's
``load_general_plugins()`` calls ``load()`` once in every process it starts (API server, EngineCore,
workers: v1/engine/core.py:129, v1/worker/worker_base.py:276). ``load()`` does nothing unless
``SPECDIFF_TRACE=<store path>`` is set. Then it wraps a few plain-Python methods of the V1 model
runner and drafter (the names in adapter.py) when their modules are imported, so only a process
that runs a model runner records, and the trace opens there at the end of ``load_model`` (before
any request; a crash at the first request still leaves the contract and the crash). With tensor
parallelism only TP rank 0 records. The ``torch.compile``d draft forward is never wrapped: the
draft is observed through forward hooks on modules that run eagerly (hooks.py), and warm-up /
profile runs are skipped (they do not go through ``sample_tokens``).

Only the V1 runner is hooked. vLLM 0.32 builds its V2 runner (the GPU default: config/vllm.py:703-738,
v1/worker/gpu_worker.py:563-576) from ``vllm.v1.worker.gpu.model_runner``; when that module is
imported in a traced process the plugin warns once that nothing per step will be recorded and how to
switch (``VLLM_USE_V2_MODEL_RUNNER=0``), and when the V2 runner is built it writes a trace whose
contract says so (``engine_runner`` 'v2 ...', every stage in ``unrecorded_stages``).

Environment: as the SGLang recorder (``SPECDIFF_TRACE``, ``SPECDIFF_CAPTURE``,
``SPECDIFF_LOGITS_TOPK``, ``SPECDIFF_RIDS``, ``SPECDIFF_MAX_QUEUE_MB``; tracer/engines/options.py).
"""

from __future__ import annotations

import atexit
import functools
import importlib.abc
import importlib.util
import inspect
import logging
import os
import sys
import time

logger = logging.getLogger("specdiff.tracer")

_rec = None  # hooks.Recorder
_adapter = None
_patched: set[str] = set()

_V1_RUNNER = "vllm.v1.worker.gpu_model_runner"
_V1_PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
_V2_RUNNER = "vllm.v1.worker.gpu.model_runner"

#: why nothing per step is recorded under the V2 runner (the warning and the contract say it)
V2_UNHOOKED = ("vLLM runs its V2 model runner (vllm.v1.worker.gpu.model_runner, the GPU default since 0.32: "
               "config/vllm.py:703-738): the specdiff recorder hooks only the V1 runner, so no per-step tensor "
               "is recorded; restart the server with VLLM_USE_V2_MODEL_RUNNER=0 to record (V1 reads the aux ids "
               "from the top-level eagle_aux_hidden_state_layer_ids, else eagle_config's: "
               "v1/worker/gpu_model_runner.py:5268-5280)")


def load(env=None) -> bool:
    """vLLM plugin entry point. Returns True when the recorder was armed in this process.

    A bad ``SPECDIFF_*`` value refuses tracing in one log line (the server runs untraced).
    """
    global _adapter
    env = os.environ if env is None else env
    from specdiff.tracer.engines.options import OptionError, Options

    try:
        opts = Options.from_env(env)
    except OptionError as exc:
        logger.error("specdiff: tracing refused: %s; the server runs untraced", exc)
        return False
    if opts is None:
        return False
    if _adapter is not None:
        return True
    from specdiff.tracer.engines.vllm.adapter import VLLMAdapter

    _adapter = VLLMAdapter.for_running()
    _Finder.opts = opts
    for mod in (_V1_RUNNER, _V1_PROPOSER, _V2_RUNNER):
        if mod in sys.modules:
            _on_import(mod)
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
    return True


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps vLLM's runner / proposer methods right after their modules are imported."""

    opts = None

    def find_spec(self, name, path, target=None):
        if name not in (_V1_RUNNER, _V1_PROPOSER, _V2_RUNNER) or name in _patched:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _on_import(name)

        spec.loader.exec_module = exec_module
        return spec


def _on_import(name: str) -> None:
    global _rec
    if name in _patched:
        return
    _patched.add(name)
    A = _adapter
    try:
        if name == _V2_RUNNER:
            # Imported only where a V2 runner is built (gpu_worker.py:565-571, cpu_worker.py:168):
            # declared and checked for GPU users, said once, and written into the trace when it runs.
            A.warn_once("v2-runner", f"specdiff: {V2_UNHOOKED}")
            A.check_runner("v2", module=name)
            _wrap_v2_init(sys.modules[name].GPUModelRunner)
            return
        if _rec is None:
            from specdiff.tracer.engines.vllm.hooks import Recorder

            A.check_version()
            _rec = Recorder(_Finder.opts, A)
            atexit.register(_close)
        missing = {n.key for n in A.check_runner("v1", module=name)}
        mod = sys.modules[name]
        if name == _V1_RUNNER:
            cls = mod.GPUModelRunner
            _wrap(cls, "execute_model", _around_execute_model, missing)
            _wrap(cls, "sample_tokens", _around_sample_tokens, missing)
            _wrap(cls, "_sample", _around_sample, missing)
            _wrap(cls, "_setup_eagle3_aux_hidden_state_outputs", _around_setup_aux, missing)
            _wrap_loader()
        else:
            _wrap(mod.SpecDecodeBaseProposer, "propose", _around_propose, missing)
    except Exception as exc:  # noqa: BLE001 - never break vLLM's import
        logger.error("specdiff: could not hook %s (%s: %s); the server runs untraced", name, type(exc).__name__, exc)


def _wrap(cls, attr: str, around, missing: set[str]) -> None:
    key = f"{'SpecDecodeBaseProposer' if 'Proposer' in cls.__name__ else 'GPUModelRunner'}.{attr}"
    if key in missing or not hasattr(cls, attr):
        return  # logged by the adapter with what becomes unobservable
    orig = getattr(cls, attr)
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def wrapper(self, *a, **kw):
        return around(orig, sig, self, *a, **kw)

    setattr(cls, attr, wrapper)


def _wrap_loader() -> None:
    """Watch the load path of target and draft (``DefaultModelLoader.load_weights``: their checkpoint
    tensors fingerprinted, the parameters left as allocated noted; tracer/engines/vllm/live_facts.py),
    unless ``SPECDIFF_WEIGHT_FACTS=0``. A watch that cannot start leaves the load as it was."""
    if _Finder.opts is None or not _Finder.opts.weight_facts:
        return
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from specdiff.tracer.engines.vllm.live_facts import watched_load

    orig = DefaultModelLoader.load_weights

    @functools.wraps(orig)
    def load_weights(self, model, model_config, *a, **kw):
        rec = _rec
        if rec is None or not rec.enabled or not _tp_rank0():
            return orig(self, model, model_config, *a, **kw)
        return watched_load(rec, orig, self, model, model_config, *a, **kw)

    DefaultModelLoader.load_weights = load_weights


def _wrap_v2_init(cls) -> None:
    orig = cls.__init__

    @functools.wraps(orig)
    def __init__(self, *a, **kw):
        orig(self, *a, **kw)
        if _tp_rank0():
            try:
                write_v2_trace(self)
            except Exception as exc:  # noqa: BLE001 - never break vLLM's start-up
                logger.error("specdiff: could not write the V2 runner's trace (%s: %s)", type(exc).__name__, exc)

    cls.__init__ = __init__


def write_v2_trace(runner) -> str | None:
    """Write the trace of a process whose V2 runner ran: a contract with the engine, its version,
    ``engine_runner`` 'v2 <module>.<Class>', every schema tensor in ``unrecorded_stages`` (why: ``V2_UNHOOKED``)
    and what the adapter found missing; no rows. Returns its path (None when tracing is off or the
    trace was already written in this process)."""
    from specdiff.tracer.engines.vllm.adapter import runner_version
    from specdiff.tracer.schema import SPECS
    from specdiff.tracer.store import TraceWriter

    opts, A = _Finder.opts, _adapter
    if opts is None or A is None or "v2-trace" in _patched:
        return None
    _patched.add("v2-trace")
    contract = {"engine": "vllm", "engine_version": A.version, "capture_level": opts.capture,
                "logits_topk": int(opts.logits_topk), "dropped_records": 0,
                "engine_runner": f"{runner_version(runner)} {type(runner).__module__}.{type(runner).__name__}",
                "unrecorded_stages": {name: V2_UNHOOKED for name in SPECS if not name.startswith("target.probe")},
                "unobservable": A.unobservable()}
    TraceWriter(opts.path, side="serve", contract=contract).close()
    return opts.path


def _close(*_a) -> None:
    if _rec is not None:
        _rec.close()


def _install_sigterm() -> None:
    from specdiff.tracer.engines.lifecycle import close_on_sigterm

    close_on_sigterm(_close)


def _tp_rank0() -> bool:
    try:
        from vllm.distributed.parallel_state import get_tp_group

        return get_tp_group().rank_in_group == 0
    except Exception:  # noqa: BLE001 - no parallel state (single process): rank 0
        return True


def _start(rec, runner) -> None:
    """Open the trace (every V1 module is imported by now: the rest of the names are checked) and
    close it on SIGTERM: installed here, after vLLM's worker installed its own handler
    (v1/executor/multiproc_executor.py:881), which ours chains to."""
    _adapter.check_runner("v1")
    rec.start(runner)
    _install_sigterm()


# ---- wrappers (every failure disables recording, never the server) ------------------------------
def _around_setup_aux(orig, sig, self, *a, **kw):
    out = orig(self, *a, **kw)
    rec = _rec
    if rec is not None and rec.active and rec.writer is None and _tp_rank0():
        try:
            _start(rec, self)
        except Exception as exc:  # noqa: BLE001
            rec.fail("GPUModelRunner._setup_eagle3_aux_hidden_state_outputs", exc)
    return out


def _around_execute_model(orig, sig, self, *a, **kw):
    """The target forward: timed into recorder_iter_s; an exception in it becomes the trace's crash."""
    rec = _rec
    if rec is None or not rec.active or rec.writer is None:
        return orig(self, *a, **kw)
    rec.phase = ("target forward (prefill / verify)", {})
    t0 = time.perf_counter()
    try:
        return orig(self, *a, **kw)
    except Exception as exc:
        rec.crashed(exc)
        raise
    finally:
        rec.iter_s += time.perf_counter() - t0


def _around_sample_tokens(orig, sig, self, *a, **kw):
    rec = _rec
    if rec is None or not rec.active:
        return orig(self, *a, **kw)
    t0 = time.perf_counter()
    cap = None
    try:
        if rec.writer is None and _tp_rank0():
            _start(rec, self)
        if rec.writer is not None:
            cap = rec.begin(self)
    except Exception as exc:  # noqa: BLE001
        rec.fail("sample_tokens (begin)", exc)
    rec.cur, rec.phase = cap, ("target sampling / verify", {})
    t1 = time.perf_counter()
    try:
        result = orig(self, *a, **kw)
    except Exception as exc:
        if rec.writer is not None:
            rec.crashed(exc)
        raise
    finally:
        rec.cur = None
    t2 = time.perf_counter()
    if cap is not None and rec.active:
        rec.finish_or_fail(cap, None, "sample_tokens (finish)")
    t3 = time.perf_counter()
    rec.hook_s += (t1 - t0) + (t3 - t2)
    rec.iter_s += t3 - t0
    return result


def _around_sample(orig, sig, self, *a, **kw):
    out = orig(self, *a, **kw)
    rec = _rec
    cap = None if rec is None else rec.cur
    if cap is not None and rec.active:
        t0 = time.perf_counter()
        try:
            b = sig.bind(self, *a, **kw)
            rec.on_sample(cap, b.arguments.get("logits"), b.arguments.get("spec_decode_metadata"), out)
        except Exception as exc:  # noqa: BLE001
            rec.fail("GPUModelRunner._sample", exc)
        rec.hook_s += time.perf_counter() - t0
    return out


def _around_propose(orig, sig, self, *a, **kw):
    rec = _rec
    cap = None if rec is None else rec.cur
    if cap is None or not rec.active:
        return orig(self, *a, **kw)
    t0 = time.perf_counter()
    try:
        args = sig.bind(self, *a, **kw).arguments
        th = args.get("target_hidden_states")
        rec.phase = ("draft propose (fc, first pass, draft steps)",
                     {"target_hidden_states": list(th.shape) if hasattr(th, "shape") else None})
        rec.on_propose(cap, args)
    except Exception as exc:  # noqa: BLE001
        rec.fail("SpecDecodeBaseProposer.propose (inputs)", exc)
    rec.hook_s += time.perf_counter() - t0
    out = orig(self, *a, **kw)
    if rec.active and rec.cur is cap:
        try:
            import torch

            cap.t["draft_ids"] = rec.snap(out, dtype=torch.int64)
        except Exception as exc:  # noqa: BLE001
            rec.fail("SpecDecodeBaseProposer.propose (outputs)", exc)
    rec.phase = ("target sampling / verify", {})
    return out
