"""What the SGLang and vLLM recorders share: ``ServingRecorder`` (lifecycle, which requests are
recorded, their prompts, host copies, contract updates, the writer hand-off, the close facts) and
the writer-side helpers of their attribution (``ContractUpdate``, ``add_aux``).

The serving thread's share of the work is kept to copies and dict lookups: a request that is not
sampled costs one sampler lookup per iteration (``choose``); a sampled one's prompt is handed over
as the engine holds it (a list, array or tensor) and turned into ints by the writer
(tracer/rows.py ``token_list``); on CPU a tensor is copied once,
straight into the writer process's shared-memory ring (``snap``, tracer/engines/writer/ring.py staging).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

import torch

from specdiff.tracer.engines.requests import is_kept, sampling_facts
from specdiff.tracer.engines.writer import open_writer

logger = logging.getLogger("specdiff.tracer")


@dataclass
class ContractUpdate:
    """Contract facts learned after the trace was opened (written by the writer, in order with the
    captures; never dropped by the writer process, tracer/engines/writer/thread.py)."""

    facts: dict

    def wait(self) -> None:
        return None

    def nbytes(self) -> int:
        return 0


def add_aux(side, out, rows, seq, pos, it) -> None:
    """Add ``target.aux_cat`` rows ``rows`` [n, K*H] and their K per-layer slices ``target.aux.{j}``
    [n, H] to ``out`` (a ``RowBatch``). K is the row width over ``side.hidden_size`` when that
    divides it, else ``side.num_aux``; neither known: the slices are not written."""
    out.add("target.aux_cat", rows, seq=seq, pos=pos, depth=0, iter=it)
    H = side.hidden_size
    K = rows.shape[-1] // H if H and rows.shape[-1] % H == 0 else side.num_aux
    if not K:
        return
    for j, chunk in enumerate(rows.chunk(K, dim=-1)):
        out.add(f"target.aux.{j}", chunk.contiguous(), seq=seq, pos=pos, depth=0, iter=it)


class ServingRecorder:
    """The state and steps both serving recorders share (one per serving process, TP rank 0).

    Subclasses set ``HANDLER``, their attribution as ``"module:function"`` of
    ``function(recorder or writer.child.WriterSide, trace writer, capture)`` (the writer process and the
    in-process thread writer both run it), and add their hot path. ``cur`` is the capture of the
    iteration running now (None outside recorded ones).
    """

    HANDLER = ""
    #: off an accelerator: a non-blocking copy into pinned memory, waited for by the writer
    #: (the capture carries a CUDA event); False: a synchronous copy on the serving thread
    ASYNC_D2H = True

    def __init__(self, opts, adapter):
        self.opts = opts
        self.adapter = adapter
        self.enabled = True
        self.writer = None  # ProcessTraceWriter or AsyncTraceWriter (open_writer)
        self.contract: dict = {}
        self.cur = None
        self.phase: tuple[str, dict] | None = None  # (forward running, its input shapes): crash record
        self.hidden_size: int | None = None
        self.num_aux: int | None = None
        self.bos_token_id = None
        self.sampler = opts.sampler()  # which requests are recorded (tracer/engines/requests.py)
        self.recorded: dict[str, str] = {}  # rid -> why it is recorded (contract sampled_requests)
        self._iter = 0
        self._lock = threading.Lock()
        self._failed_once = False
        self._unobservable_n = 0  # adapter.missing entries already in the trace's contract
        self._prompted: set[str] = set()  # recorded rids whose prompt was handed over
        self._prompt_firsts: list[int] = []  # first token of each recorded prompt (bos_added)
        self.hook_s = 0.0  # wall time of the hooks on the serving thread
        self.iter_s = 0.0  # wall time of the recorded iterations
        # thread-writer state (the writer process keeps its own: writer.child.WriterSide)
        self.seq_ids: dict[str, int] = {}
        self.seq_tokens: dict[str, list[int]] = {}
        self.seq_prompt: dict[str, int] = {}
        self._attribute = None  # the function HANDLER names (imported by the thread writer)

    # -- lifecycle --
    def fail(self, where: str, exc: BaseException) -> None:
        """A hook failed: stop recording (one log line), the server keeps serving."""
        self.enabled = False
        self.cur = None
        if not self._failed_once:
            self._failed_once = True
            logger.error("specdiff: recorder hook %s failed (%s: %s); tracing disabled, the server keeps serving",
                         where, type(exc).__name__, exc)

    @property
    def active(self) -> bool:
        return self.enabled and (self.writer is None or self.writer.active)

    def adopt(self, contract: dict) -> None:
        """Take the contract read from the live engine at start-up: the shapes the attribution
        needs, the BOS id (popped: it becomes ``bos_added`` at close), the sampling fact (added)."""
        from specdiff.tracer.contract import UNKNOWN, known

        self.contract = contract
        self.hidden_size = known(contract, "hidden_size")
        self.num_aux = len(known(contract, "aux_hf_indices") or []) or None
        self._unobservable_n = len(contract.get("unobservable") or [])
        bos = contract.pop("bos_token_id", None)
        self.bos_token_id = None if bos == UNKNOWN else bos
        contract["sampling"] = self.sampler.facts

    def open(self, contract: dict, first: list, *, side: dict) -> None:
        """Open the trace's writer (``writer.open_writer``; ``side``: the writer process's
        ``WriterSide`` arguments) and record which writer runs: the contract's ``recorder_writer``,
        read off the writer object (``facts()``)."""
        self.writer = open_writer(self.opts, contract, first, self._write, handler=self.HANDLER, side=side)
        self.writer.recorded = self.recorded  # the one dict, grown by ``choose``: what a drop may list
        self.update_contract(recorder_writer=self.writer.facts())

    def close_facts(self) -> dict:
        """Engine-specific facts added to the contract at close (none here)."""
        return {}

    def close(self, *, crash: dict | None = None) -> None:
        """Drain the writer and close the trace; ``crash`` (tracer/crash.py) goes into the contract."""
        from specdiff.tracer.contract import bos_added_fact

        w = self.writer
        if w is None:
            return
        self.enabled = False
        facts = {"recorder_hook_s": round(self.hook_s, 4), "recorder_iter_s": round(self.iter_s, 4),
                 "recorder_writer_s": round(w.busy_s, 4), "unobservable": self.adapter.unobservable(),
                 "bos_added": bos_added_fact(self._prompt_firsts, self.bos_token_id),
                 "recorder_writer": w.facts()}
        facts.update(sampling_facts(self.recorded, w.dropped_rids))
        facts.update(self.close_facts())
        if crash is not None:
            facts["crash"] = crash
        if w.close(contract=facts):
            logger.info("specdiff: trace closed: %s (%d iterations written, %d dropped; hooks %.2f s of %.2f s "
                        "in recorded iterations, writer %.2f s)", self.opts.path, w.written, w.dropped,
                        self.hook_s, self.iter_s, w.busy_s)

    def crashed(self, exc: BaseException, *args) -> None:
        """The engine raised in a recorded iteration: ``record_crash(exc, *args)`` (each engine's),
        never masking the engine's own exception (a failure here is one log line)."""
        try:
            self.record_crash(exc, *args)
        except Exception as exc2:  # noqa: BLE001
            logger.error("specdiff: could not record the crash (%s: %s)", type(exc2).__name__, exc2)

    def finish_or_fail(self, cap, result, where: str) -> None:
        """``finish(cap, result)`` (each engine's hand-off of an iteration's capture); a failure
        stops recording (``fail``), never the server."""
        try:
            self.finish(cap, result)
        except Exception as exc:  # noqa: BLE001
            self.fail(where, exc)

    # -- which requests, their prompts (hot path) --
    def keep_rid(self, rid: str) -> bool:
        """Whether ``rid``'s rows are written: chosen by the sampler (``choose``) and not dropped."""
        return is_kept(rid, self.recorded, self.writer)

    def choose(self, rids: list[str], marks=None) -> dict[str, str]:
        """The recorded requests among ``rids`` that are new (rid -> reason); updates ``recorded``.
        ``marks``: None, or a function of the request's index returning its ``custom_params`` (called
        only for a rid not decided yet). An unsampled request costs one dict lookup (the sampler's)."""
        new = {}
        recorded, decide = self.recorded, self.sampler.decide
        dropped = () if self.writer is None else self.writer.dropped_rids
        for i, rid in enumerate(rids):
            if rid in recorded or rid in dropped:
                continue
            why = decide(rid, None if marks is None else (lambda i=i: marks(i)))
            if why is not None:
                recorded[rid] = new[rid] = why
        return new

    def note_prompt(self, cap, rid: str, prompt_of) -> None:
        """Hand a recorded request's prompt (``prompt_of()``, called only for a recorded request
        not handed over yet) to ``cap`` once, as the engine holds it: the writer makes ints of it
        (``tracer.rows.token_list``); MISSING / None is recorded as an empty prompt. Only its first token is read
        here (the ``bos_added`` fact). A request that is not recorded costs two set lookups."""
        if rid in self._prompted or not self.keep_rid(rid):
            return
        from specdiff.tracer.engines.names import MISSING

        self._prompted.add(rid)
        prompt = prompt_of()
        if prompt is MISSING or prompt is None:
            prompt = ()
        cap.prompts[rid] = prompt
        if len(prompt):
            self._prompt_firsts.append(int(prompt[0]))

    # -- host copies (hot path) --
    def snap(self, t, owner=None, dtype=None):
        """A host copy of ``t`` (as ``dtype`` when given: converted in the same copy) that later
        engine work cannot change. CPU: one copy, into the writer process's ring when it has room
        (``writer.stage``), else a new tensor. An accelerator (``ASYNC_D2H``): a non-blocking copy
        into pinned memory (valid once the capture's event completes; the writer's publisher thread
        waits for it, off the serving thread); else a synchronous one. ``owner``: the capture the
        copy belongs to (default ``cur``; None: not staged)."""
        if t is None:
            return None
        if t.requires_grad:  # (a served tensor does not: inference mode)
            t = t.detach()
        dtype = t.dtype if dtype is None else dtype
        if t.is_cpu:  # (``is_cpu``, not ``device.type``: ~50 copies an iteration, each attribute counts)
            stage = getattr(self.writer, "stage", None)
            owner = self.cur if owner is None else owner
            got = None if stage is None or owner is None else stage(t, owner, dtype)
            return t.to(dtype, copy=True) if got is None else got
        if not self.ASYNC_D2H:
            return t.to("cpu", dtype)
        out = torch.empty(t.shape, dtype=dtype, pin_memory=True)
        out.copy_(t, non_blocking=True)
        return out

    # -- contract updates --
    def update_contract(self, **facts) -> None:
        """Merge facts learned after the trace was opened (the writer writes them, in order)."""
        self.contract.update(facts)
        if self.writer is not None:
            self.writer.submit(ContractUpdate(dict(facts)))

    def sync_unobservable(self) -> None:
        """Queue a contract update when engine names went missing after the trace was opened
        (instance attributes first seen in a batch)."""
        n = len(self.adapter.missing)
        if n != self._unobservable_n and self.writer is not None:
            self._unobservable_n = n
            self.update_contract(unobservable=self.adapter.unobservable())

    # -- thread writer --
    def _write(self, tw, item) -> None:
        """The in-process writer thread's handler (``SPECDIFF_WRITER=thread`` or no ring)."""
        if isinstance(item, ContractUpdate):
            tw.set_contract(**item.facts)
            return
        if self._attribute is None:
            import importlib

            mod, fn = self.HANDLER.split(":")
            self._attribute = getattr(importlib.import_module(mod), fn)
        self._attribute(self, tw, item)


__all__ = ["ContractUpdate", "ServingRecorder", "add_aux"]
