"""Each sample checked against the digest its writer recorded, as the readers read it.

The writer keeps every sample's sha256 (`writer.sample_digest`) in its shard's stats file. The
training and fine-tuning readers read a sample's member payloads anyway, so they check them
against it: a shard changed after it was written (a flipped bit on disk or in an upload) stops
the run naming the shard and the sample, where it used to train on the changed bytes. A shard
without a stats file (written by other tools) is read unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from shards.schema import SchemaError, decode_sample
from shards.storage import Location
from shards.writer import STATS_SUFFIX, sample_digest


def recorded_digests(shard: Location) -> dict[str, str]:
    """{key: sha256} of a shard's samples from its stats file; empty without one."""
    stats = shard.with_name(f"{shard.stem}{STATS_SUFFIX}")
    if not stats.is_file():
        return {}
    try:
        recorded = json.loads(stats.read_text())
        return dict(zip(recorded["keys"], recorded["sample_sha256"], strict=True))
    except (ValueError, KeyError, TypeError) as err:
        raise SchemaError(f"{stats}: not a stats file of this shard format ({err})") from err


def check_sample(shard: Location, key: str, members: Mapping[str, bytes], recorded: str) -> None:
    """Raise SchemaError when the payloads `members` ({suffix: bytes}) of sample `key` do not
    have the digest its stats file `recorded`."""
    actual = sample_digest([(f"{key}.{suffix}", data) for suffix, data in members.items()])
    if actual == recorded:
        return
    changed = (f"its sha256 differs from the one in {shard.stem}{STATS_SUFFIX}: the shard changed "
               f"on disk or in transit; `pipeline shards verify {shard.parent}` lists every such "
               "sample")
    try:  # what is wrong with it, where its bytes say (as reader.decode_checked words it)
        problems = decode_sample(key, dict(members)).validate()
    except SchemaError as err:
        problems = [str(err)]
    if problems:
        raise SchemaError(f"{shard}: sample {key!r} is corrupt: {'; '.join(problems)} ({changed})")
    raise SchemaError(f"{shard}: sample {key!r} is not what was written ({changed})")
