"""How models are loaded for a replay: the dtypes a target or draft may be loaded in (``DTYPES``,
by name) and ``quiet_transformers``, which keeps transformers' loading output off the terminal.
Shared by the training recorder (``replay.record``) and the diff's re-runs.
"""

from __future__ import annotations

import torch

__all__ = ["DTYPES", "quiet_transformers"]

#: dtype name -> torch dtype; the names are ``replay.record.train_options.DTYPE_NAMES`` (kept torch-free
#: there for the CLI), in the same order
DTYPES = {name: getattr(torch, name) for name in ("bfloat16", "float32", "float16")}


def quiet_transformers() -> None:
    """No weight-loading progress bars or info logs: the CLI's output stays one line per fact."""
    try:
        from transformers.utils import logging as tlog
        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
    except Exception:
        pass
