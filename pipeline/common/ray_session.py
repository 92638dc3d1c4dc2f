"""The Ray session of a run: join a cluster, or start a local Ray for the run and stop it after.

Ray is imported only here and in the engines that call it, so the rest of the project (and the
libraries) work without Ray installed.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager


@contextmanager
def ray_session(address: str | None, *, log_to_driver: bool = False):
    """Join the cluster at `address`, or start a fresh local Ray for this run; shut down after.
    log_to_driver: show the workers' output here (training's progress bar and messages)."""
    if address is None:
        # The embedded Ray's workers run here with this interpreter. Ray's `uv run` hook would
        # start each of them through `uv run` and upload the working directory (the hook is read
        # when ray is first imported). Ray also starts workers at niceness 15 above the raylet's,
        # which on a shared machine hands the run's CPU to any other process: keep the command's.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        os.environ.setdefault("RAY_worker_niceness", "0")
    import ray

    # Ray's own actors log warnings that are noise here (e.g. its placement group cleaner polls
    # the State API, which needs the dashboard we do not start): keep their errors only.
    ray.init(
        address=address or "local", include_dashboard=False, log_to_driver=log_to_driver,
        logging_level=logging.ERROR, logging_config=ray.LoggingConfig(log_level="ERROR"),
    )
    try:
        yield ray
    finally:
        ray.shutdown()
