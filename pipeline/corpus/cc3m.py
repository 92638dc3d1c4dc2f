"""CC3M captions from img2dataset's webdataset output (the layout pipeline/datasets/cc3m.py reads).

    {shard:05d}.tar       {key}.jpg, {key}.txt (the caption), {key}.json (url, caption, status...)
    {shard:05d}.parquet   one row per url: key, status ("success" or why not), caption, ...

A sample is taken when its tar holds an image member (so `pipeline extract --dataset cc3m` has
features for it) and a caption (the .txt member, else the .json's "caption"), and neither the
parquet row nor the .json says its status is other than "success". The key is the member name
before its first dot, exactly as pipeline/datasets/cc3m.py names the image.
"""

from __future__ import annotations

import json
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import pyarrow.parquet as pq

from pipeline.corpus.config import CorpusError
from pipeline.corpus.sources import Text, clean, progress_bar, say_reading
from pipeline.datasets.base import IMAGE_SUFFIXES
from pipeline.datasets.tar_index import tar_members

SUCCESS = "success"


def _statuses(path: Path) -> dict[str, str]:
    """key -> status of one shard's parquet ({} when img2dataset wrote none)."""
    if not path.is_file():
        return {}
    try:
        # ParquetFile, not read_table: read_table imports pyarrow.dataset and pandas (seconds).
        table = pq.ParquetFile(path).read(columns=["key", "status"]).to_pydict()
    except Exception as err:  # pyarrow raises several types for unreadable or foreign files
        raise CorpusError(f"{path}: not an img2dataset parquet with key and status "
                          f"({err})") from err
    return {k: s for k, s in zip(table["key"], table["status"]) if k is not None}


def _members(tar_path: Path) -> tuple[set[str], dict[str, str], dict[str, dict]]:
    """(keys with an image, key -> .txt caption, key -> .json metadata) of one tar."""
    images, captions, metas = set(), {}, {}
    try:
        for key, ext, member, tar in tar_members(tar_path):
            if PurePosixPath(member.name).suffix.lower() in IMAGE_SUFFIXES:
                images.add(key)
            elif ext == "txt":
                captions[key] = tar.extractfile(member).read().decode("utf-8")
            elif ext == "json":
                try:
                    metas[key] = json.loads(tar.extractfile(member).read())
                except ValueError as err:
                    raise CorpusError(f"{tar_path}: member {member.name} is not valid JSON "
                                      f"({err})") from err
    except (tarfile.TarError, OSError, UnicodeDecodeError) as err:
        raise CorpusError(f"{tar_path}: not a readable img2dataset tar ({err})") from err
    return images, captions, metas


def read_cc3m(folder: Path, *, progress: bool = False) -> Iterator[Text]:
    """The captions of the downloaded samples, shard by shard, each shard in key order."""
    if not folder.is_dir():
        raise CorpusError(f"{folder}: not a directory (cc3m.shards: img2dataset output folder)")
    tars = sorted(p for p in folder.glob("*.tar") if p.stem.isdigit())
    if not tars:
        raise CorpusError(f"{folder}: no img2dataset shards ({{shard:05d}}.tar) in it")
    seen: dict[str, Path] = {}
    for tar_path in progress_bar(tars, "cc3m", "shard", progress):
        say_reading(tar_path, progress)
        statuses = _statuses(tar_path.with_suffix(".parquet"))
        images, captions, metas = _members(tar_path)
        for key in sorted(images):
            if key in seen:
                raise CorpusError(f"{folder}: key {key} is in both {seen[key].name} and "
                                  f"{tar_path.name}")
            seen[key] = tar_path
            meta = metas.get(key, {})
            if statuses.get(key, SUCCESS) != SUCCESS or meta.get("status", SUCCESS) != SUCCESS:
                continue
            caption = captions.get(key, meta.get("caption"))
            text = clean(caption) if isinstance(caption, str) else ""
            if text:
                yield Text("cc3m", key, text, None)
