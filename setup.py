"""Everything is in pyproject.toml but one file: ``specdiff_zarr_hook.pth``, which must land at the top
of site-packages (beside the packages, not inside one), where no pyproject.toml key can put it. See
specdiff_zarr_hook.py for what its one line does and why."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "specdiff_zarr_hook.pth"


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


setup(cmdclass={"build_py": BuildPyWithPth})
