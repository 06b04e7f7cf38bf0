"""The serving recorders' trace writers, and the training recorder's: captures in, trace rows out,
off the thread that captured them.

``thread``: ``AsyncTraceWriter``, a bounded queue drained by one thread (lossy for serving,
lossless for ``record train``). ``process``: ``ProcessTraceWriter``, the server's handle on a writer
process; ``child``: that process (``python -m specdiff.tracer.engines.writer.child``, with
``WriterSide``, the recorder state it holds; it leaves the server's process tree, so an engine's
stop does not kill it while it writes); ``ring``: the shared-memory ring between the two; ``alive``:
finding and waiting for a trace's writer processes from outside the server (``record serve``).
``open_writer`` picks one for a serving recorder.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("specdiff.tracer")


def open_writer(opts, contract: dict, first: list, write, *, handler: str, side: dict):
    """The recorder's lossy writer: a writer process fed through shared memory
    (``SPECDIFF_WRITER=process``, the default), or the in-process thread (``thread``, and when no
    shared-memory ring can be made: the thread writer's ``why`` says which). Shared by the SGLang
    and vLLM recorders.

    Args:
        first: ``(name, tensor, seq, pos)`` appends to make once the trace is open (the d2t map).
        write: the thread writer's handler ``write(tw, item)``; ``handler``/``side``: the writer
            process's (``ProcessTraceWriter``).

    Raises:
        TraceError: the trace cannot be opened (e.g. the path exists).
    """
    from specdiff.tracer.engines.writer.process import ProcessTraceWriter
    from specdiff.tracer.engines.writer.thread import AsyncTraceWriter
    from specdiff.tracer.store import TraceWriter

    why = "SPECDIFF_WRITER=thread"
    if opts.writer == "process":
        try:
            return ProcessTraceWriter(opts.path, contract=contract, handler=handler, side=side, first=first,
                                      ring_mb=opts.max_queue_mb)
        except OSError as exc:
            why = f"no shared-memory ring: {exc}"
            logger.warning("specdiff: %s; rows are built in this process", why)
    tw = TraceWriter(opts.path, side="serve", contract=contract)
    for name, data, seq, pos in first:
        tw.append(name, data, seq=seq, pos=pos)
    w = AsyncTraceWriter(tw, write, max_items=64, max_bytes=opts.max_queue_mb << 20)
    w.why = why
    return w
