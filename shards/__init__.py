"""Region features in WebDataset shards, as a library: read them in one's own loop.

    import shards
    for sample in shards.iter_samples("shards/"):             # Sample: .key, .meta, .arrays
        sample.arrays["features"], sample.arrays["boxes"]
    batches = shards.RegionBatches("shards/", batch_size=32, max_boxes=36, shuffle=1000)
    loader = torch.utils.data.DataLoader(batches, batch_size=None, num_workers=2)
    store = shards.FeatureStore("shards/")                    # random access by key
    store.get_image("coco", "139")

Shards follow the WebDataset convention with numpy and JSON members only: plain
`webdataset.WebDataset(url).decode()` reads them without any of this code (docs/python.md).
Sources are directories, shard paths or URLs (s3://...). What is named here is the public API;
the modules behind it are internal and may change.
"""

from shards.batch import RegionBatch, collate_regions
from shards.dataset import RegionBatches
from shards.reader import ShardDataset, iter_samples, list_shards
from shards.schema import Sample, SchemaError, make_key, split_key
from shards.store import FeatureStore

__all__ = [
    "FeatureStore",
    "RegionBatch",
    "RegionBatches",
    "Sample",
    "SchemaError",
    "ShardDataset",
    "collate_regions",
    "iter_samples",
    "list_shards",
    "make_key",
    "split_key",
]
