"""Display names of the Visual Genome 1600 object classes and 400 attributes.

Line k of each vocabulary file is id k (the ids in RegionFeatures and in shards); a line may list
synonyms separated by commas, the first being the display name. VinVL's ids name the classes of
its own label map (`labelmap_names`).
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path


@cache
def _names(filename: str) -> tuple[str, ...]:
    text = resources.files("extractor").joinpath("vg1600", filename).read_text(encoding="utf-8")
    return tuple(line.split(",")[0].strip() for line in text.splitlines() if line.strip())


def object_names() -> tuple[str, ...]:
    """1600 object class names; index = object id."""
    return _names("objects_vocab.txt")


def attribute_names() -> tuple[str, ...]:
    """400 attribute names; index = attribute id."""
    return _names("attributes_vocab.txt")


def labelmap_names(path: str | Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(objects, attributes) of a scene_graph_benchmark label map such as VinVL's
    `VG-SGG-dicts-vgoi6-clipped.json`: its `label_to_idx` and `attribute_to_idx` number the
    classes from 1 (0 is background, "no attribute"), so object id k is the name of index k + 1.
    ValueError naming the file where it is not such a map."""
    try:
        found = json.loads(Path(path).read_text(encoding="utf-8"))
        maps = found["label_to_idx"], found["attribute_to_idx"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a label map with label_to_idx and attribute_to_idx "
                         f"({type(err).__name__}: {err})") from None
    names = []
    for mapping in maps:
        by_index = {int(i): name for name, i in mapping.items() if int(i) > 0}
        if sorted(by_index) != list(range(1, len(by_index) + 1)):
            raise ValueError(f"{path}: its indices are not 1..{len(by_index)}")
        names.append(tuple(by_index[i] for i in range(1, len(by_index) + 1)))
    return names[0], names[1]
