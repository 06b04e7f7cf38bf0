"""Dask for ``specdiff diff --workers N`` / ``--dask ADDRESS``: a client (and, for ``--workers``,
a local cluster of N single-threaded worker processes), handed to the diff as a block runner.

dask / distributed are imported only here, only when one of those options is given.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

from specdiff.replay.diff.compare.blocks import ExecutorBlocks
from specdiff.tracer.errors import SpecdiffError

#: seconds to reach a running scheduler before giving up (connecting to a live one takes < 1 s)
CONNECT_TIMEOUT_S = 5


class DaskError(SpecdiffError):
    """Dask is missing or its scheduler cannot be reached (one line, exit 2)."""


@contextmanager
def dask_blocks(*, workers: int | None = None, address: str | None = None):
    """Yield a ``replay.diff.compare.blocks.ExecutorBlocks`` on a Dask cluster; close the client (and the
    local cluster with its worker processes) on exit, whatever happens inside.

    Args:
        workers: start a ``distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
            processes=True)`` on this machine.
        address: connect to the running scheduler at ``address`` (e.g. ``tcp://host:8786``); its
            workers must have specdiff installed and read the traces at the paths/URLs given.

    Raises:
        DaskError: dask/distributed are not installed, or the scheduler cannot be reached within
            ``CONNECT_TIMEOUT_S`` seconds, or it has no worker.
    """
    try:
        import distributed
    except ImportError as exc:
        raise DaskError(f"--workers/--dask need dask.distributed ({exc}); install it: "
                        "pip install 'dask[distributed]'") from None
    cluster = None
    if workers is not None:
        # dashboard off: no port to collide with on a shared machine; logs off: the report and one
        # error line only (a worker heartbeat cut by the shutdown logs a traceback otherwise)
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                                           dashboard_address=None, silence_logs=logging.CRITICAL)
        address = cluster
    try:
        try:
            client = distributed.Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
        except (OSError, TimeoutError) as exc:
            raise DaskError(f"cannot reach the Dask scheduler at {address} within {CONNECT_TIMEOUT_S} s "
                            f"({type(exc).__name__}); start one (dask scheduler) or check the address") from None
        try:
            n = len(client.scheduler_info(n_workers=-1)["workers"]) if workers is None else workers
            if not n:
                raise DaskError(f"the Dask scheduler at {address} has no workers; start some (dask worker "
                                f"{address}) and run again")
            yield ExecutorBlocks(client.get_executor(pure=False), workers=n)
        finally:
            client.close()
    finally:
        if cluster is not None:
            cluster.close()
