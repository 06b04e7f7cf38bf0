"""Plain zarr / xarray read a trace's ``bfloat16`` arrays with no specdiff import.

specdiff declares its ``bfloat16`` zarr data type in zarr's ``zarr.data_type`` entry-point group
(pyproject.toml), but zarr 3.1.6 collects that group without ever loading it
(``zarr/core/dtype/registry.py`` ``DataTypeRegistry._lazy_load`` has no caller), so a fresh
interpreter's ``xarray.open_datatree(trace, engine="zarr")`` fails with ``No Zarr data type found that
matches 'bfloat16'``. The install puts ``specdiff_zarr_hook.pth`` in site-packages (setup.py), whose
one line runs :func:`install` at interpreter start: a meta-path finder that waits for ``import zarr``
and, once zarr has finished loading, imports ``specdiff.tracer.store.arrays``, whose import registers
the data type. Nothing else is imported at start-up (this module is stdlib only, microseconds), and a
Python that never imports zarr never imports specdiff.
"""

from __future__ import annotations

import sys

# importlib.util and importlib.abc are imported only when zarr is (they cost ~10 ms at every start)

#: the module whose import registers specdiff's ``bfloat16`` with zarr's data type registry
REGISTERING_MODULE = "specdiff.tracer.store.arrays"


class _AfterZarrImport:
    """Finds nothing itself: on the first ``import zarr`` it wraps zarr's loader so that
    :data:`REGISTERING_MODULE` is imported right after zarr's own module body has run."""

    def find_spec(self, fullname, path=None, target=None):
        """``importlib.abc.MetaPathFinder.find_spec``: zarr's own spec, its loader wrapped."""
        if fullname != "zarr":
            return None
        import importlib.util
        sys.meta_path.remove(self)  # once: the real finders answer from here on
        spec = importlib.util.find_spec("zarr")
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_zarr = spec.loader.exec_module

        def exec_then_register(module):
            exec_zarr(module)
            _register()

        spec.loader.exec_module = exec_then_register
        return spec


def _register() -> None:
    """Import :data:`REGISTERING_MODULE` (zarr is loaded)."""
    try:
        import importlib

        importlib.import_module(REGISTERING_MODULE)
    except Exception:  # noqa: BLE001 - a broken specdiff must never break the user's zarr import;
        pass  # zarr's own "No Zarr data type found that matches 'bfloat16'" then says what is missing


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (idempotent); if zarr is already loaded, register now."""
    if "zarr" in sys.modules:
        _register()
        return
    if not any(isinstance(f, _AfterZarrImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterZarrImport())
