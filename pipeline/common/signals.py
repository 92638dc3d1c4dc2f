"""SIGTERM, the signal a scheduler sends before it kills (Kubernetes, Slurm, a spot reclaim: 30 s
before SIGKILL on Kubernetes), taken as Ctrl-C is: the work in hand is abandoned as an interrupt
abandons it (nothing half-written is kept: shards, corpora and checkpoints appear by rename) and
the command exits 143 (128 + 15) instead of 130. A training run does better
(pipeline/train/stop.py): it finishes the step in flight and writes a checkpoint first."""

from __future__ import annotations

import signal


class Terminated(KeyboardInterrupt):
    """SIGTERM received: raised where the main thread was, as Ctrl-C's KeyboardInterrupt is."""


def _raise(signum, frame) -> None:
    raise Terminated


def terminate_as_interrupt() -> None:
    """From now on SIGTERM raises Terminated in the main thread (call it from the main thread)."""
    signal.signal(signal.SIGTERM, _raise)
