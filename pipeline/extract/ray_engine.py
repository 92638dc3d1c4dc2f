"""The Ray engine of `pipeline extract`: Ray Data decode tasks and detector actors.

    units (driver) -> decode_unit: read, decode, resize each image (CPU tasks, `decoders` at a time)
                   -> UnitDetector: the unit's good images as one batch (actor pool: `actors`
                      actors with `gpus_per_actor` GPUs each; the detector is loaded once per actor;
                      two calls at once per actor, so that one submits its batch while the other
                      waits for the device and ships its results)
                   -> driver: ShardSink writes each shard in plan order and closes it after its
                      last unit; extract.log gets the units each node detected

A row is one unit (a detector batch cut from the shard plan), so batches never depend on Ray's
block boundaries or on where an earlier run stopped, and results come back in plan order
(preserve_order). The driver puts the run's inputs into the object store once (`UnitInputs`: the
image list, each unit's range of it, the given boxes), and the rows start as unit numbers
(`ray.data.range`, read by the decode tasks themselves): the driver holds no per-unit object
beyond the plan, and a decoder process takes its refs from the inputs it fetched once (the image
list of img2dataset's tars is a few numpy arrays, read in place from the object store). The
decoders index img2dataset's tars through one shared indexer (a `TarIndexes` actor), so that each
tar is read through once, not once per decoder that reads from it. Rows then
are {"unit": index into the driver's unit list, "payload": bytes}, the payload pickled between our
own processes: list[Prepared] decoded -> (list[Prepared] detected, stage seconds); a detected row
also names the node (IP) whose actor detected it, so a run on a cluster records where its work
went.

Faults: Ray Data's defaults (Ray 2.60) restart a dead actor and retry its tasks (max_restarts =
max_task_retries = -1) and retry a task whose worker died (max_retries = -1); tests pin that.
A unit's result is a function of the unit alone, so a retried unit gives the same samples. Only
the driver writes files. If the driver dies, Ray ends its job's tasks and actors; an embedded Ray
(whose processes the driver started with kernel fate-sharing) dies with it, and a re-run starts a
fresh one (address "local" never joins an existing cluster) and skips the completed shards.
A cluster node that dies takes its actors, tasks and blocks with it, and Ray redoes them elsewhere
(tests/test_multinode.py); but the layout is fixed at the start, so on a cluster left smaller the
restarted actors can hold every CPU the decoders need, and the run waits until a node joins.
"""

from __future__ import annotations

import logging
import pickle
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from extractor.config import PreprocessConfig
from pipeline.common.config import ConfigError
from pipeline.common.ray_session import ray_session
from pipeline.datasets import ImageRef, tar_index
from pipeline.datasets.read import read_images
from pipeline.datasets.tar_index import Index, TarIndexes, index_tar
from pipeline.extract.config import EngineConfig, ExtractJobConfig
from pipeline.extract.output import ShardSink
from pipeline.extract.plan import Unit
from pipeline.extract.steps import SharedExtractor, prepare, ship_pixels


@dataclass(frozen=True)
class RayLayout:
    """Where the work runs. torch_threads: intra-op threads of a CPU actor (None: Ray's default,
    one per CPU the actor reserves)."""

    actors: int
    gpus_per_actor: float
    decoders: int
    torch_threads: int | None

    @property
    def device(self) -> str:
        return "cuda" if self.gpus_per_actor > 0 else "cpu"


def plan_layout(run: EngineConfig, resources: dict[str, float]) -> RayLayout:
    """The run's actors, GPUs per actor and decoders, defaults filled from the cluster's resources.

    Each actor and each decoder reserves one CPU. A CPU actor runs torch on the cluster's CPUs
    divided among the actors: the detector is the bottleneck and the decoders interleave with it,
    as the local engine's decoding threads do.
    """
    cpus, gpus = int(resources.get("CPU", 0)), resources.get("GPU", 0.0)
    if run.device not in ("auto", "cpu", "cuda"):
        raise ConfigError(
            f"device {run.device!r}: with Ray use auto, cpu or cuda (Ray assigns the GPUs)"
        )
    gpus_per_actor = run.gpus_per_actor
    if gpus_per_actor is None:
        gpus_per_actor = 1.0 if gpus and run.device != "cpu" else 0.0
    if run.device == "cpu" and gpus_per_actor > 0:
        raise ConfigError("device cpu with gpus_per_actor > 0; drop one of them")
    if run.device == "cuda" and gpus_per_actor == 0:
        raise ConfigError(f"device cuda, but the Ray cluster has {gpus:g} GPUs for the actors")
    actors = run.actors or (int(gpus // gpus_per_actor) if gpus_per_actor else 1)
    if actors < 1 or actors * gpus_per_actor > gpus:
        raise ConfigError(
            f"{actors} actor(s) x {gpus_per_actor:g} GPU(s) do not fit the cluster's {gpus:g} GPUs"
        )
    decoders = run.decoders or max(1, cpus - actors)
    if actors + decoders > cpus:
        raise ConfigError(
            f"{actors} actor(s) + {decoders} decoder(s) need one CPU each; the cluster has {cpus}"
        )
    threads = max(1, cpus // actors) if gpus_per_actor == 0 else None
    return RayLayout(actors, gpus_per_actor, decoders, threads)


@dataclass(frozen=True)
class UnitInputs:
    """What the decoders read units from, put into the object store once per run: the image list,
    each unit's [start, stop) of it (one row per unit), and the given boxes (or None)."""

    images: Sequence[ImageRef]
    bounds: np.ndarray
    given_boxes: dict[str, np.ndarray] | None


_fetched: dict[str, UnitInputs] = {}  # a decoder process's current run's inputs, by object id


def _inputs(ref, indexer) -> UnitInputs:
    """The run's inputs, fetched once per decoder process (Ray reuses a process for many tasks),
    which from then on indexes tars through the run's shared `indexer`."""
    key = ref.hex()
    if key not in _fetched:
        import ray

        _fetched.clear()  # an earlier run's, in a process Ray kept
        _fetched[key] = ray.get(ref)
        tar_index.index_with(lambda tar_path: _shared_index(ray, indexer, tar_path))
    return _fetched[key]


def _shared_index(ray, indexer, tar_path) -> Index:
    """The shared indexer's index of the tar; its OSError (an unreadable tar) as itself, so that
    each image's error reads as when its process indexes the tar."""
    try:
        return ray.get(indexer.index.remote(tar_path))
    except ray.exceptions.RayTaskError as err:
        if isinstance(err.cause, OSError):
            raise err.cause from None
        raise


def decode_unit(
    row: dict, inputs, indexer, preprocess: PreprocessConfig, keep_bytes: bool,
    device_resize: bool,
) -> dict:
    """Decode stage: unit number `row["id"]` -> its list[Prepared] (bad images as errors), its
    images read together (read_images: one request per run of neighbouring tar members).
    inputs: the ObjectRef of the run's UnitInputs; indexer: its TarIndexes actor. device_resize:
    the actors detect on GPUs, which resize where they can (see prepare)."""
    unit = int(row["id"])
    run = _inputs(inputs, indexer)
    start, stop = run.bounds[unit]
    refs = run.images[start:stop]
    items = [prepare(ref, preprocess, run.given_boxes, keep_bytes, device_resize, data)
             for ref, data in zip(refs, read_images(refs))]
    ship_pixels(items, preprocess, pin=False)  # pinned memory would not survive the object store
    return {"unit": unit, "payload": pickle.dumps(items, pickle.HIGHEST_PROTOCOL)}


class UnitDetector:
    """Detect stage: loads the detector once, then maps a decoded unit to its detected unit.

    Ray runs two calls at once in an actor (CALLS, in threads), as the local engine submits the
    next batch before it collects the current one: while one call waits for the device, the
    other unpickles and pins its unit and queues it on the device (SharedExtractor), so a GPU
    does not idle between units.
    """

    CALLS = 2

    def __init__(
        self, job: ExtractJobConfig, weights: str | None, detector: dict, layout: RayLayout
    ):
        # Imported here, so the decode workers never load the detector's modules.
        import ray

        from pipeline.extract.detector import build_extractor

        self.node = ray.util.get_node_ip_address()  # named in each row it detects
        if layout.torch_threads:
            torch.set_num_threads(layout.torch_threads)
        extractor, loaded = build_extractor(job, weights, layout.device)
        if loaded != detector:
            raise RuntimeError(f"an actor loaded detector {loaded}, not the run's {detector}")
        self.detector = SharedExtractor(extractor)
        self.pin = extractor.device.type == "cuda"
        self.preprocess = job.preprocess

    def __call__(self, row: dict) -> dict:
        items = pickle.loads(row["payload"])
        # Pinned here (the object store cannot carry pinned memory): a GPU copies pinned pixels
        # without waiting for the work already queued, pageable ones only after it.
        ship_pixels(items, self.preprocess, pin=self.pin)
        seconds: Counter = Counter()
        self.detector.detect(items, seconds)
        payload = pickle.dumps((items, dict(seconds)), pickle.HIGHEST_PROTOCOL)
        return {"unit": row["unit"], "payload": payload, "node": self.node}


class RayEngine:
    """Runs units through Ray Data and writes them with the driver's ShardSink.

    MAX_BLOCKS: Ray Data plans a task per block, at ~1.6 ms and ~11 KB of the driver's memory
    each (112,500 blocks: 3 minutes and 1.3 GB before the first unit), so a run of more units
    than this puts several units into a block, which a decoder then decodes in turn.

    SHARED_TARS: the tars' indexes the shared indexer keeps (an img2dataset tar of 10,000 urls:
    27,000 members, about 6 MB held, 0.7 MB sent to a decoder); the decoders read from a few
    tars at a time, in the plan's order.
    """

    MAX_BLOCKS = 2048
    SHARED_TARS = 32

    def __init__(
        self, job: ExtractJobConfig, weights: str | None, detector: dict,
        given_boxes: dict[str, np.ndarray] | None, address: str | None,
    ):
        self.job = job
        self.weights = str(Path(weights).resolve()) if weights else None
        self.detector = detector
        self.given_boxes = given_boxes
        self.address = address

    def run(self, units: list[Unit], sink: ShardSink) -> None:
        """The progress bar's stage is what the driver waits on: Ray's start, a batch in Ray
        (its decode task or detector actor: the driver cannot tell which), or its writing."""
        if not units:
            return
        progress = sink.progress
        in_ray = "decode, detector (Ray)"
        progress.stage(0, "starting Ray")
        start = time.perf_counter()
        with ray_session(self.address, without_ray="--engine local") as ray:
            sink.tally.seconds["ray_start"] += time.perf_counter() - start
            layout = plan_layout(self.job.run, ray.cluster_resources())
            sink.log.write(f"ray: {layout}, cluster {ray.cluster_resources()}")
            rows = self._dataset(ray, units, layout).iter_rows()
            nodes: Counter = Counter()
            # Until the first unit is back, the actors start: a Python worker each, importing
            # torch and loading the detector (about 20 s on 2 CPU cores).
            progress.stage(0, f"starting {layout.actors} detector actor(s)")
            for expected, row in enumerate(rows):
                if row["unit"] != expected:
                    raise RuntimeError(f"Ray returned unit {row['unit']} where {expected} was due")
                items, seconds = pickle.loads(row["payload"])
                sink.tally.seconds.update(seconds)
                progress.stage(expected, "write")
                sink.add(units[expected], items)
                nodes[row["node"]] += 1
                if expected + 1 < len(units):
                    progress.stage(expected + 1, in_ray)
            # Where the detection ran: on a cluster, whether the actors spread over its nodes.
            sink.log.write(f"ray: units per node {dict(sorted(nodes.items()))}")

    def _dataset(self, ray, units: list[Unit], layout: RayLayout):
        from ray.data import ActorPoolStrategy, DataContext, TaskPoolStrategy

        context = DataContext.get_current()
        context.execution_options.preserve_order = True
        context.enable_progress_bars = False
        context.print_on_execution_start = False
        logging.getLogger("ray.data").setLevel(logging.WARNING)
        logging.getLogger("ray.data._internal.progress").setLevel(logging.ERROR)  # ours: tqdm
        bounds = np.array([(unit.start, unit.stop) for unit in units], np.int64)
        inputs = ray.put(UnitInputs(units[0].images, bounds, self.given_boxes))
        # Threaded (a call per decoder at once), no CPU of its own: it waits on reads mostly.
        indexer = ray.remote(TarIndexes).options(
            num_cpus=0, max_concurrency=layout.decoders, max_restarts=-1, max_task_retries=-1
        ).remote(self.SHARED_TARS, index_tar)
        preprocess = self.job.preprocess
        # A decoder holds a worker (Python, torch: about 0.5 GiB), one image of up to max_pixels
        # (uint8 BGR) and its resized float32 copy. Declaring that memory also keeps Ray Data from
        # fusing decoding into the actors (it fuses a task stage into the next actor stage when
        # their pool sizes and resources match), which would run decoding and detection in turn.
        decode_memory = (
            2**29 + 3 * preprocess.max_pixels + 12 * preprocess.min_size * preprocess.max_size
        )
        return (
            ray.data.range(len(units), override_num_blocks=min(len(units), self.MAX_BLOCKS))
            .map(
                decode_unit,
                fn_kwargs={"inputs": inputs, "indexer": indexer, "preprocess": preprocess,
                           "keep_bytes": self.job.output.keep_images,
                           "device_resize": layout.gpus_per_actor > 0},
                compute=TaskPoolStrategy(size=layout.decoders),
                num_cpus=1,
                memory=decode_memory,
            )
            .map(
                UnitDetector,
                fn_constructor_args=(self.job, self.weights, self.detector, layout),
                compute=ActorPoolStrategy(
                    size=layout.actors,
                    max_concurrent_calls_per_actor=UnitDetector.CALLS,
                    enable_true_multi_threading=True,
                ),
                num_cpus=1,
                num_gpus=layout.gpus_per_actor,
            )
        )
