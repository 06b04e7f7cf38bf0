"""A trace in the array ecosystem: zarr and xarray open a closed trace with its bf16
tensors as real ``bfloat16`` values (zarr's data type registry, which the installed
``specdiff_zarr_hook.pth`` fills when zarr is imported: no specdiff import) and with no warning (consolidated metadata: no listing, so zarr
never meets the journal); traces of the older layout still read, and ``specdiff upgrade`` brings
them to it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from specdiff.tracer.store import TraceWriter, open_trace
from specdiff.tracer.store import arrays as store_arrays
from specdiff.tracer.store import writer as store_writer

VALUES = (torch.arange(40 * 64, dtype=torch.float32).reshape(40, 64) / 7 - 100).to(torch.bfloat16)

#: a user's session, in a fresh interpreter outside the repo: every warning is an error; prints the
#: data variable's dtype and its values' raw bits as json
XARRAY_PROBE = """
import json, sys, warnings
import numpy as np
warnings.simplefilter("error")
import xarray  # no specdiff import: specdiff_zarr_hook.pth registers bfloat16 when zarr loads
tree = xarray.open_datatree(sys.argv[1], engine="zarr")
data = tree["tensors/draft.fc_out"].ds["data"]
ids = tree["tensors/verify.draft_tokens"].ds["data"]
assert "torch" not in sys.modules  # the registration costs no torch import
print(json.dumps({"dtype": str(data.dtype), "dims": list(data.dims),
                  "bits": np.asarray(data.values).view(np.uint16).ravel().tolist(),
                  "ids_dtype": str(ids.dtype)}))
"""


def _write(path: Path) -> Path:
    with TraceWriter(str(path), side="serve", chunk_bytes=64 * 2 * 16, overwrite=True) as w:
        w.add_sequence(np.arange(40), rid="r")
        w.append("draft.fc_out", VALUES, seq=0, pos=np.arange(40))
        w.append("verify.draft_tokens", torch.arange(40 * 4).reshape(40, 4), seq=0, pos=np.arange(40))
    return path


def _old(path: Path, monkeypatch) -> Path:
    """A trace in the layout written before this change: bf16 declared ``uint16`` (its bits), no
    consolidated metadata."""
    monkeypatch.setattr(store_writer, "ZARR_DTYPES", store_arrays.STORAGE_DTYPES)
    monkeypatch.setattr(store_writer, "as_stored", lambda arr, name: arr)
    monkeypatch.setattr(store_writer, "consolidate", lambda store: None)
    _write(path)
    monkeypatch.undo()
    return path


def _xarray(path: Path, cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", XARRAY_PROBE, str(path)], cwd=cwd, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def _bits() -> list[int]:
    return VALUES.view(torch.int16).numpy().view(np.uint16).ravel().tolist()


def test_xarray_opens_a_trace_with_bfloat16_data_and_no_warning(tmp_path):
    path = _write(tmp_path / "t.trace")
    root = json.loads((path / "zarr.json").read_text())
    assert "tensors/draft.fc_out/data" in root["consolidated_metadata"]["metadata"]
    meta = json.loads((path / "tensors" / "draft.fc_out" / "data" / "zarr.json").read_text())
    assert meta["data_type"] == "bfloat16"
    got = _xarray(path, tmp_path)
    assert got["dtype"] == "bfloat16" and got["dims"] == ["row", *got["dims"][1:]]
    assert got["bits"] == _bits()  # bit for bit what was recorded
    assert got["ids_dtype"] == "int64"
    # and specdiff itself reads it as before: bf16 bits, exact float32, torch bf16
    trace = open_trace(str(path))
    assert torch.equal(trace.read_torch("draft.fc_out").view(torch.int16), VALUES.view(torch.int16))
    assert np.array_equal(trace.read("draft.fc_out"), VALUES.float().numpy())
    assert trace.verify() == []


def test_a_trace_of_the_older_layout_still_reads_and_upgrade_brings_it_to_xarray(tmp_path, monkeypatch, run_cli):
    old = _old(tmp_path / "old.trace", monkeypatch)
    assert json.loads((old / "tensors" / "draft.fc_out" / "data" / "zarr.json").read_text())["data_type"] == "uint16"
    assert "consolidated_metadata" not in json.loads((old / "zarr.json").read_text()) or \
        json.loads((old / "zarr.json").read_text())["consolidated_metadata"] is None
    a = open_trace(str(old))
    assert np.array_equal(a.read("draft.fc_out"), VALUES.float().numpy()) and a.verify() == []

    new = tmp_path / "new.trace"
    result = run_cli("upgrade", old, new)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{new}: 1 arrays rewritten (crc32c checksums, bfloat16 data type), metadata consolidated"
    b = open_trace(str(new))
    assert b.verify() == []
    assert torch.equal(b.read_torch("draft.fc_out").view(torch.int16), VALUES.view(torch.int16))
    assert np.array_equal(b.keys("draft.fc_out")["pos"], a.keys("draft.fc_out")["pos"])
    assert np.array_equal(b.read("verify.draft_tokens"), a.read("verify.draft_tokens"))
    assert _xarray(new, tmp_path)["bits"] == _bits()
    # the old copy is never changed, and a second upgrade into an existing path is refused
    assert json.loads((old / "tensors" / "draft.fc_out" / "data" / "zarr.json").read_text())["data_type"] == "uint16"
    again = run_cli("upgrade", old, new)
    assert again.exit_code == 2
    assert again.stderr.strip() == f"specdiff: error: {new}: already exists; choose another path"


def test_upgrade_refuses_an_unclosed_trace_with_one_line(tmp_path, run_cli):
    path = tmp_path / "live.trace"
    w = TraceWriter(str(path), side="serve", overwrite=True)
    w.append("draft.fc_out", VALUES, seq=0, pos=np.arange(40))
    w.flush()
    result = run_cli("upgrade", path, tmp_path / "copy.trace")
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "the writer never closed this trace" in result.stderr
    assert not (tmp_path / "copy.trace").exists()
    w.close()


def test_a_closed_trace_opens_in_zarr_without_listing(tmp_path):
    """Consolidated metadata lists every array, so an object store is never listed."""
    import zarr

    path = _write(tmp_path / "t.trace")
    group = zarr.open_group(str(path), mode="r", use_consolidated=True)
    assert group.metadata.consolidated_metadata is not None
    assert {"tensors/draft.fc_out/data", "tensors/verify.draft_tokens/data", "sequences/tokens"} <= \
        set(group.metadata.consolidated_metadata.flattened_metadata)
