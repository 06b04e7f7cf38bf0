"""What pyproject.toml cannot say, in code:

- the packages: each top folder of the checkout is a ``specdiff.<folder>`` package (:data:`PACKAGE_DIR`),
  and every package under it is found (``find_packages``: each folder with an ``__init__.py``), never
  listed by hand (a hand list once left ``specdiff.replay.fix`` and ``specdiff.replay.trainers`` out of
  the wheel: `record train` and `fix` failed with ModuleNotFoundError in a non-editable install).
  setuptools' ``[tool.setuptools.packages.find]`` finds packages under a folder by their folder names,
  with no prefix, so it cannot map ``replay/`` to ``specdiff.replay``;
- ``specdiff_zarr_hook.pth``, which must land at the top of site-packages (beside the packages, not
  inside one), where no pyproject.toml key can put it. See specdiff_zarr_hook.py for what its one
  line does and why.
"""

from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PTH = "specdiff_zarr_hook.pth"
#: the product folders: ``specdiff.<folder>`` is ``<folder>/`` (tests/, benchmarks/, traces/ ship nothing)
FOLDERS = ("eagle3", "tracer", "replay", "tui", "demo", "demo_models")
PACKAGE_DIR = {f"specdiff.{folder}": folder for folder in FOLDERS}


def packages(root: Path = Path(__file__).parent) -> list[str]:
    """Every package of the wheel: each ``specdiff.<folder>`` of :data:`PACKAGE_DIR` and every folder
    with an ``__init__.py`` beneath it, named by its path (``replay/diff/align`` ->
    ``specdiff.replay.diff.align``)."""
    return sorted(name + sub for name, folder in PACKAGE_DIR.items()
                  for sub in ("", *(f".{p}" for p in find_packages(str(root / folder)))))


class BuildPyWithPth(build_py):
    """build_py, plus the .pth copied to the wheel's root (site-packages once installed)."""

    def run(self):
        super().run()
        self.copy_file(str(Path(__file__).parent / PTH), str(self._pth_dir() / PTH))

    def _pth_dir(self) -> Path:
        # an editable install (setuptools >= 64, editable_wheel.py) zips the install_lib folder it
        # configured (the unpacked wheel) and nothing of build_lib but a finder: the .pth goes there
        if getattr(self, "editable_mode", False):
            return Path(self.get_finalized_command("install").install_lib)
        return Path(self.build_lib)


if __name__ == "__main__":
    setup(cmdclass={"build_py": BuildPyWithPth}, package_dir=PACKAGE_DIR, packages=packages())
