"""The import graph of the project, read from the source, points one way.

Every import statement counts, wherever it is (module top, inside a function, under
TYPE_CHECKING): a lazy import still joins two modules at run time. `import a.b` and
`from a.b import c` join the importer to module a.b (or a.b.c when c is a module); the package
a, which Python imports first, is not counted, so a package's __init__ may import its own modules.

The rules (pipeline/__init__.py's LAYERS is the layer order):
- no circle between modules;
- the libraries `extractor`, `model` and `shards` import nothing of `pipeline`, nor of each other,
  nor Ray (they run where Ray is not installed);
- a pipeline module imports its own package, the libraries and packages of lower layers only;
- one reader per format: a tar is opened only by shards/ (our shards) and the img2dataset
  reader (pipeline/datasets/cc3m.py), and written by the world's CC3M writer;
- no two classes of the project share a name.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from pipeline import LAYERS

ROOT = Path(__file__).resolve().parents[1]
LIBRARIES = ("extractor", "model", "shards")
PACKAGES = ("pipeline", *LIBRARIES)


def modules_of(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of the project's packages under `root`."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name the module imports (for `from a import b`: a.b, which may be a module
    or an attribute of a); relative imports resolved."""
    names = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports."""
    modules = modules_of(root)
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in imported_names(module, path):
            while name and name not in modules:  # a.b.attribute -> module a.b
                name = name.rpartition(".")[0]
            if name and name != module:
                targets.add(name)
        graph[module] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def unit_of(module: str) -> str:
    """A pipeline module's package ("extract" for pipeline.extract.job; "cli" for pipeline.cli),
    or the library it belongs to."""
    parts = module.split(".")
    return parts[1] if parts[0] == "pipeline" and len(parts) > 1 else parts[0]


def layer_violations(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Each import that the rules forbid, as "importer -> imported: why"."""
    rank = {unit: i for i, layer in enumerate(layers) for unit in layer}
    problems = []
    for module, targets in sorted(graph.items()):
        top, unit = module.split(".")[0], unit_of(module)
        if top == "pipeline" and module != "pipeline" and unit not in rank:
            problems.append(f"{module}: package {unit!r} has no layer in pipeline.LAYERS")
            continue
        for target in sorted(targets):
            target_top, target_unit = target.split(".")[0], unit_of(target)
            if top in LIBRARIES and target_top != top:
                problems.append(f"{module} -> {target}: a library imports only itself")
            elif top == "pipeline" and target_top == "pipeline" and target_unit != unit:
                if target == "pipeline":
                    continue  # the package's own LAYERS, read by this test only
                if rank.get(target_unit, len(rank)) >= rank[unit]:
                    problems.append(f"{module} -> {target}: {target_unit!r} is not below {unit!r}")
    return problems


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
    return root


# --- the project --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_the_graph_sees_the_project(graph):
    assert len(graph) > 150
    assert "pipeline.train.loop" in graph["pipeline.train.launch"]
    assert "pipeline.common.ray_session" in graph["pipeline.train.launch"]  # a lazy import
    assert "model.archs" in graph["model.checkpoints.formats"]


def test_no_module_circles(graph):
    assert circles(graph) == []


def test_imports_point_down_the_layers(graph):
    assert layer_violations(graph) == []


def test_pretraining_and_fine_tuning_meet_only_in_the_trainer(graph):
    units = {unit_of(t) for m, targets in graph.items() for t in targets if unit_of(m) == "train"}
    assert units <= {"train", "common", *LIBRARIES}
    for a, b in (("pretrain", "finetune"), ("finetune", "pretrain")):
        assert not [m for m, ts in graph.items() if unit_of(m) == a and
                    any(unit_of(t) == b for t in ts)]


def test_libraries_never_import_ray():
    for module, path in modules_of(ROOT).items():
        if module.split(".")[0] in LIBRARIES:
            names = imported_names(module, path)
            assert not [n for n in names if n.split(".")[0] == "ray"], module


def test_tars_are_read_in_one_place_per_format():
    openers = sorted(
        str(path.relative_to(ROOT)) for module, path in modules_of(ROOT).items()
        if "tarfile.open(" in path.read_text()
    )
    assert [p for p in openers if not p.startswith("shards/")] == [
        "pipeline/datasets/tar_index.py",  # img2dataset's downloads: the one reader
        "pipeline/world/formats/cc3m.py",  # writes them for the world
    ]


def test_no_two_classes_share_a_name():
    where = defaultdict(list)
    for module, path in modules_of(ROOT).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where[node.name].append(module)
    assert {name: found for name, found in where.items() if len(found) > 1} == {}


# --- the checks themselves fail on a broken tree ------------------------------------------


def test_a_circle_is_found(tmp_path):
    tree = write_tree(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/train/__init__.py": "",
        "pipeline/train/loop.py": "def f():\n    from pipeline.train.job import Job\n",
        "pipeline/train/job.py": "from .loop import f\n",
        "pipeline/train/plot.py": "import pipeline.train.job\n",
    })
    assert circles(import_graph(tree)) == [["pipeline.train.job", "pipeline.train.loop"]]


def test_upward_sideways_and_library_imports_are_found(tmp_path):
    tree = write_tree(tmp_path, {
        "pipeline/__init__.py": "",
        "pipeline/common/config.py": "from pipeline.train.loop import x\n",
        "pipeline/train/loop.py": "from pipeline.common.config import y\n",
        "pipeline/pretrain/job.py": "from pipeline.finetune import job\n",
        "pipeline/finetune/job.py": "from pipeline.train.loop import x\n",
        "pipeline/newstage/run.py": "",
        "model/lxmert.py": "from shards.schema import Sample\n",
        "shards/schema.py": "if False:\n    from pipeline.common import config\n",
    })
    assert layer_violations(import_graph(tree)) == [
        "model.lxmert -> shards.schema: a library imports only itself",
        "pipeline.common.config -> pipeline.train.loop: 'train' is not below 'common'",
        "pipeline.newstage.run: package 'newstage' has no layer in pipeline.LAYERS",
        "pipeline.pretrain.job -> pipeline.finetune.job: 'finetune' is not below 'pretrain'",
        "shards.schema -> pipeline.common.config: a library imports only itself",
    ]


def test_libraries_load_without_ray_or_object_storage_packages():
    """The GPU box runs extractor, model and shards with torch, torchvision and transformers only:
    importing them loads neither Ray nor the object-store packages (imported on a URL's first
    use, shards/storage.py)."""
    modules = sorted(m for m in modules_of(ROOT) if m.split(".")[0] in LIBRARIES)
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(sorted(m for m in ('ray', 'upath', 's3fs') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_training_workers_load_the_detector_only_to_train_it():
    """A pretraining or fine-tuning worker on frozen features imports neither the detector nor
    torchvision (~180 MB of its memory); `visual.trainable` imports them in the job."""
    modules = ["pipeline.pretrain.job", "pipeline.finetune.job", "pipeline.train.loop",
               "pipeline.train.launch"]
    code = (f"import sys\nfor m in {modules!r}: __import__(m)\n"
            "print(sorted(m for m in ('torchvision', 'extractor.detector', 'extractor.front_end')"
            " if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"
