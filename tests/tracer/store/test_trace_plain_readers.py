"""A trace in plain zarr / xarray with no specdiff import (issue 34, item 5).

The package declares its ``bfloat16`` data type in zarr's ``zarr.data_type`` entry-point group
(pyproject.toml), checked here on the metadata setuptools builds from pyproject.toml (what ``pip
install`` writes). zarr 3.1.6 collects that group but never loads it, so a fresh interpreter still
needs ``import specdiff.tracer.store``: the second test pins that fact (it fails, and the docs' one line
can go, on the first zarr that loads data-type entry points).
"""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import PathDistribution
from pathlib import Path

import numpy as np
import pytest
import torch

from specdiff.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parents[3]
VALUES = (torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8) / 3 - 20).to(torch.bfloat16)

#: a fresh interpreter, no specdiff import: puts the entry point argv[2] (``name=value``, or ``-``: none)
#: in zarr's ``zarr.data_type`` list as an installed package would, loads that list the way zarr's
#: registry would (``_lazy_load``) when argv[3] is "load", then opens trace argv[1] in xarray (after
#: ``import specdiff.tracer.store`` when argv[3] is "import"); prints json
PROBE = """
import json, sys
from importlib.metadata import EntryPoint
import numpy as np
import xarray
from zarr.core.dtype import data_type_registry
path, entry, how = sys.argv[1:4]
if entry != "-":
    name, value = entry.split("=", 1)
    data_type_registry._lazy_load_list.append(EntryPoint(name=name, value=value, group="zarr.data_type"))
before = sorted(m for m in sys.modules if m.startswith("specdiff"))
if how == "load":
    data_type_registry._lazy_load()
if how == "import":
    import specdiff.tracer.store
try:
    data = xarray.open_datatree(path, engine="zarr")["tensors/draft.fc_out"].ds["data"]
except ValueError as exc:
    print(json.dumps({"error": str(exc), "specdiff_before": before}))
else:
    print(json.dumps({"dtype": str(data.dtype), "bits": np.asarray(data.values).view(np.uint16).ravel().tolist(),
                      "specdiff_before": before}))
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plain") / "t.trace"
    with TraceWriter(str(path), side="serve", overwrite=True) as w:
        w.add_sequence(np.arange(24), rid="r")
        w.append("draft.fc_out", VALUES, seq=0, pos=np.arange(24))
    return str(path)


@pytest.fixture(scope="module")
def built_entry_points(tmp_path_factory):
    """The entry points of the metadata setuptools builds from this checkout's pyproject.toml."""
    out = tmp_path_factory.mktemp("metadata")
    code = ("import sys\nfrom setuptools import build_meta\n"
            "print(build_meta.prepare_metadata_for_build_wheel(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return PathDistribution(out / done.stdout.strip().splitlines()[-1]).entry_points


def _probe(trace: str, entry: str, how: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, trace, entry, how], capture_output=True, text=True,
                          timeout=120, cwd=Path(trace).parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _bits() -> list[int]:
    return VALUES.view(torch.int16).numpy().view(np.uint16).ravel().tolist()


def test_the_package_registers_bfloat16_in_zarrs_data_type_entry_point_group(trace, built_entry_points):
    (ep,) = built_entry_points.select(group="zarr.data_type")
    assert (ep.name, ep.value) == ("bfloat16", "specdiff.tracer.store.arrays:BFloat16")
    # loaded the way zarr's registry loads that group, it is all plain xarray needs
    got = _probe(trace, f"{ep.name}={ep.value}", "load")
    assert got["specdiff_before"] == []
    assert got["dtype"] == "bfloat16" and got["bits"] == _bits()


def test_zarr_3_1_6_never_loads_the_entry_point_so_readers_import_specdiff_tracer_store(trace, built_entry_points):
    (ep,) = built_entry_points.select(group="zarr.data_type")
    plain = _probe(trace, f"{ep.name}={ep.value}", "none")  # as installed: zarr lists it, never loads it
    assert plain["error"] == "No Zarr data type found that matches 'bfloat16'"
    fixed = _probe(trace, "-", "import")  # the one line traces/FORMAT.md and the README give
    assert fixed["dtype"] == "bfloat16" and fixed["bits"] == _bits()
