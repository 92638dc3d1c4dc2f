"""The world's scenes rendered and encoded as image files, by one process per core.

A scene is a function of the world's seed and its image id alone (sampling.make_scene), so the
files are the same bytes however many processes render them; the scenes come back in the order
asked. Rendering and encoding are ~60% of `pipeline world generate` (the demo's world: 1,414
scenes). The workers are spawned: each imports the command's modules again (torch among them,
~3 s, the two at once), so a pool starts only for a batch of LEAST_SHARED scenes or more; they
ignore Ctrl-C (the command's process stops them).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from PIL import Image

from pipeline.world.formats.files import jpeg_bytes, png_bytes
from pipeline.world.sampling import make_scene
from pipeline.world.scene import Palette, Scene

# Fewer scenes than this render here (~1.5-3 s of work on one core): the workers' start would
# cost as much as it saves.
LEAST_SHARED = 128


@dataclass(frozen=True)
class SceneFile:
    """One scene to render into a file: its id and split, its fewest objects, the format."""

    image_id: int
    split: str
    least_objects: int = 1
    format: str = "jpeg"  # or "png"


@dataclass(frozen=True)
class Painter:
    """Renders a SceneFile of world `seed` into (scene, file bytes, (width, height))."""

    seed: int
    min_objects: int
    max_objects: int
    palette: Palette
    jpeg_quality: int

    def scene(self, job: SceneFile) -> tuple[Scene, Image.Image]:
        """The job's scene and its picture, not encoded."""
        return make_scene(job.image_id, job.split, self.seed,
                          min_objects=max(self.min_objects, job.least_objects),
                          max_objects=max(self.max_objects, job.least_objects),
                          palette=self.palette)

    def __call__(self, job: SceneFile) -> tuple[Scene, bytes, tuple[int, int]]:
        scene, picture = self.scene(job)
        data = (png_bytes(picture) if job.format == "png"
                else jpeg_bytes(picture, self.jpeg_quality))
        return scene, data, picture.size


def _ignore_ctrl_c() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class Pictures:
    """`pictures(jobs)`: each job's (scene, bytes, size), in order, by up to `workers` processes
    (None: one per core this process may use), started at the first batch that needs them and
    ended with the `with` block."""

    def __init__(self, painter: Painter, workers: int | None = None) -> None:
        self.painter = painter
        self.workers = workers if workers is not None else len(os.sched_getaffinity(0))
        self.pool = None

    def __enter__(self) -> Pictures:
        return self

    def __exit__(self, *_) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
            self.pool = None

    def __call__(self, jobs: Sequence[SceneFile]) -> Iterator[tuple[Scene, bytes, tuple[int, int]]]:
        if self.workers < 2 or len(jobs) < LEAST_SHARED:
            return map(self.painter, jobs)
        if self.pool is None:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            # spawn: the command's process may hold torch's threads, which a fork would copy
            self.pool = ProcessPoolExecutor(self.workers, initializer=_ignore_ctrl_c,
                                            mp_context=multiprocessing.get_context("spawn"))
        chunk = max(1, min(16, len(jobs) // (4 * self.workers)))
        return self.pool.map(self.painter, jobs, chunksize=chunk)
