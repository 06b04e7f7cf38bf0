"""Real SGLang on a CPU: pure-torch kernel stand-ins and a server launcher.

SGLang 0.5.23 with ``SGLANG_USE_CPU_ENGINE=1`` imports ``*_cpu`` ops from ``sgl_kernel``
unconditionally, but the PyPI ``sglang-kernel`` wheel (which installs a package also named
``sgl_kernel``) is CUDA-only. This folder holds a pure-torch package named ``sgl_kernel``
that provides those ops; putting :data:`STANDIN_PATH` first on ``PYTHONPATH`` of the server
process makes it shadow the wheel's package. On a GPU none of this is used.

See ``specdiff.tracer.engines.sglang.cpu.launch`` for the launcher and ``serve.py`` for the AMX override.
"""

from __future__ import annotations

import os

#: Directory that contains the stand-in ``sgl_kernel`` package. Put it first on
#: ``PYTHONPATH`` (or ``sys.path``) so that ``import sgl_kernel`` finds the stand-in.
STANDIN_PATH: str = os.path.dirname(os.path.abspath(__file__))

__all__ = ["STANDIN_PATH"]
