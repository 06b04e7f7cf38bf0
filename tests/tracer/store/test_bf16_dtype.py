"""zarr's ``bfloat16`` data type without ml_dtypes at open (tracer/store/arrays.py ``BFloat16``):
ml_dtypes' import cost most of ``specdiff info``'s start-up, so opening a trace parses a
bf16 array's metadata, fill value included, without it, and reading values loads it."""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest
import torch

from specdiff.tracer.store import TraceWriter
from specdiff.tracer.store.arrays import BFloat16

# values bf16 holds exactly, ties that round to even (1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6), values
# float32 holds but bf16 does not, values neither holds, and the extremes
VALUES = [0.0, -0.0, 1.0, -2.5, 1 + 2 ** -8, 1 + 3 * 2 ** -8, 0.1, 1 / 3, 3.3895e38, 3.4e38, 1e39, -1e-40,
          float("inf"), float("-inf")]


@pytest.mark.parametrize("value", VALUES)
def test_a_fill_value_is_the_bf16_rounded_value_as_float32(value):
    got = BFloat16(endianness="little").cast_scalar(value)
    want = np.float32(ml_dtypes.bfloat16(value))
    assert isinstance(got, np.float32)
    assert got.view(np.uint32) == want.view(np.uint32), (value, float(got), float(want))


def test_nan_fill_value_stays_nan():
    assert np.isnan(BFloat16(endianness="little").cast_scalar(float("nan")))


#: a fresh interpreter opens the bf16 array of trace argv[1] in zarr, says whether ml_dtypes came in with
#: the metadata (and its fill value), then reads the values and says again
PROBE = """
import json, sys
import numpy as np
import zarr
import specdiff.tracer.store
arr = zarr.open_array(sys.argv[1] + "/tensors/draft.fc_out/data", mode="r")
at_open = {"ml_dtypes": "ml_dtypes" in sys.modules, "fill": float(arr.metadata.fill_value),
           "data_type": str(arr.metadata.data_type.to_json(zarr_format=3))}
values = arr[:]
print(json.dumps({"at_open": at_open, "ml_dtypes": "ml_dtypes" in sys.modules, "dtype": str(values.dtype),
                  "shape": list(values.shape), "bits": values.view(np.uint16).ravel().tolist()}))
"""


def test_opening_a_bf16_array_needs_no_ml_dtypes_and_reading_it_gives_bfloat16(tmp_path):
    path = tmp_path / "t.trace"
    values = (torch.arange(16 * 4, dtype=torch.float32).reshape(16, 4) / 3 - 7).to(torch.bfloat16)
    with TraceWriter(str(path), side="serve", overwrite=True) as w:
        w.add_sequence(np.arange(16), rid="r")
        w.append("draft.fc_out", values, seq=0, pos=np.arange(16))
    done = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["at_open"] == {"ml_dtypes": False, "fill": 0.0, "data_type": "bfloat16"}
    assert got["ml_dtypes"] and got["dtype"] == "bfloat16"
    assert got["bits"] == values.view(torch.int16).numpy().view(np.uint16).ravel().tolist()
