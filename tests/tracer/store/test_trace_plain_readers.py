"""A trace in plain zarr / xarray with no specdiff import.

zarr 3.1.6 collects the ``zarr.data_type`` entry point specdiff declares (pyproject.toml) but never
loads it, so the install also puts ``specdiff_zarr_hook.pth`` in site-packages (setup.py): at
interpreter start it adds a finder that imports ``specdiff.tracer.store.arrays`` (which registers
``bfloat16``) right after zarr has loaded, and nothing else (specdiff_zarr_hook.py). Checked here in
fresh interpreters of the installed environment, in the wheel and editable wheel setuptools builds
from this checkout, and on the two ways it could go wrong: zarr imported before the hook runs, and a
registration that fails (zarr must still import).
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from specdiff.tracer.store import TraceWriter

ROOT = Path(__file__).resolve().parents[3]
VALUES = (torch.arange(24 * 8, dtype=torch.float32).reshape(24, 8) / 3 - 20).to(torch.bfloat16)

#: a fresh interpreter, no specdiff import: argv[2] says what happens first ("plain": nothing;
#: "unhooked": the .pth's finder taken off sys.meta_path, as zarr alone would behave; "late": zarr
#: imported before ``specdiff_zarr_hook.install()`` runs; "broken": the hook pointed at a module that
#: does not exist), then xarray opens trace argv[1]; prints json
PROBE = """
import json, sys
mode = sys.argv[2]
startup = sorted(m for m in sys.modules if m.startswith("specdiff") or m in ("zarr", "torch", "xarray"))
if mode in ("unhooked", "late"):
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_AfterZarrImport"]
if mode == "broken":
    import specdiff_zarr_hook
    specdiff_zarr_hook.REGISTERING_MODULE = "specdiff.no_such_module"
import numpy as np
import xarray
import zarr
if mode == "late":
    import specdiff_zarr_hook
    specdiff_zarr_hook.install()
out = {"startup": startup, "torch": "torch" in sys.modules}
try:
    data = xarray.open_datatree(sys.argv[1], engine="zarr")["tensors/draft.fc_out"].ds["data"]
except ValueError as exc:
    out["error"] = str(exc)
else:
    out.update(dtype=str(data.dtype), bits=np.asarray(data.values).view(np.uint16).ravel().tolist())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("plain") / "t.trace"
    with TraceWriter(str(path), side="serve", overwrite=True) as w:
        w.add_sequence(np.arange(24), rid="r")
        w.append("draft.fc_out", VALUES, seq=0, pos=np.arange(24))
    return str(path)


def _probe(trace: str, mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, trace, mode], capture_output=True, text=True,
                          timeout=120, cwd=Path(trace).parent)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _bits() -> list[int]:
    return VALUES.view(torch.int16).numpy().view(np.uint16).ravel().tolist()


def test_plain_xarray_reads_bfloat16_with_no_specdiff_import_and_start_up_loads_only_the_hook(trace):
    got = _probe(trace, "plain")
    assert got["dtype"] == "bfloat16" and got["bits"] == _bits()
    # interpreter start-up imported the stdlib-only hook and nothing of specdiff, zarr or torch
    assert [m for m in got["startup"] if not m.startswith("specdiff_zarr_hook")] == []
    assert got["startup"] == ["specdiff_zarr_hook"]
    assert got["torch"] is False  # registering bfloat16 costs no torch import


def test_without_the_hook_zarr_3_1_6_never_loads_the_entry_point(trace):
    # the fact the hook exists for: pins it, so the hook can go on the first zarr that loads
    # data-type entry points (this test then fails)
    got = _probe(trace, "unhooked")
    assert got["error"] == "No Zarr data type found that matches 'bfloat16'"


def test_zarr_imported_before_the_hook_is_installed_is_registered_at_install(trace):
    got = _probe(trace, "late")
    assert got["dtype"] == "bfloat16" and got["bits"] == _bits()


def test_a_registration_that_fails_never_breaks_the_users_zarr_import(trace):
    got = _probe(trace, "broken")  # zarr and xarray imported; the read says what is missing
    assert got["error"] == "No Zarr data type found that matches 'bfloat16'"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_the_wheels_setuptools_builds_put_the_pth_at_site_packages_root(tmp_path, kind):
    build = "build_wheel" if kind == "wheel" else "build_editable"
    code = f"import sys\nfrom setuptools import build_meta\nprint(build_meta.{build}(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel = tmp_path / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "specdiff_zarr_hook.pth" in names, sorted(n for n in names if "/" not in n)
        assert zf.read("specdiff_zarr_hook.pth").decode().strip() == (
            "import specdiff_zarr_hook; specdiff_zarr_hook.install()")
    if kind == "wheel":  # the module itself ships beside it (an editable install maps it to the checkout)
        assert "specdiff_zarr_hook.py" in names
