"""specdiff.tracer: the trace schema, the zarr trace store, and the recorders.

Importable inside an SGLang worker: no Textual, no transformers at import time.
"""

from specdiff.tracer.errors import SpecdiffError, TraceError
from specdiff.tracer.schema import SPECS, STAGE_ORDER, TensorSpec, aux_name, spec_for

__all__ = ["SpecdiffError", "TraceError", "STAGE_ORDER", "SPECS", "TensorSpec", "aux_name", "spec_for"]
