"""What `extractor.load(...)(images)` returns per image: its Regions, or an ImageFailure."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from PIL import Image

from extractor import drawing
from extractor.config import PreprocessConfig
from extractor.features import RegionFeatures
from extractor.inputs import ImageInput, read_image
from extractor.labels import attribute_names, object_names


@dataclass
class Regions(RegionFeatures):
    """The regions of one image (RegionFeatures: boxes_xyxy_abs, features, object_ids / conf,
    attr_ids / conf, cls_probs, image_height / width), with the image they came from.

    The arrays are those `pipeline extract` stores for the image (shards.schema.build_sample
    casts ids to int32 and class probabilities to float16 on the way).
    source: the input as given (a path, a PIL image, an array or a tensor), which `show` decodes
        again; name: how errors named it.
    """

    source: ImageInput | None = None
    name: str = ""

    @property
    def image_size(self) -> tuple[int, int]:
        """(height, width) of the original image, pixels."""
        return self.image_height, self.image_width

    @property
    def object_names(self) -> list[str]:
        """The display name of each region's object (extractor.labels)."""
        names = object_names()
        return [names[i] for i in self.object_ids]

    @property
    def attribute_names(self) -> list[str]:
        """The display name of each region's top attribute (whatever its confidence)."""
        names = attribute_names()
        return [names[i] for i in self.attr_ids]

    def arrays(self) -> dict[str, np.ndarray]:
        """The per-region arrays under their shard names: boxes, object_ids, object_conf,
        attr_ids, attr_conf, features (and cls_probs when extracted)."""
        arrays = {"boxes": self.boxes_xyxy_abs, "object_ids": self.object_ids,
                  "object_conf": self.object_conf, "attr_ids": self.attr_ids,
                  "attr_conf": self.attr_conf, "features": self.features}
        return arrays | ({} if self.cls_probs is None else {"cls_probs": self.cls_probs})

    def __repr__(self) -> str:
        return (f"Regions({self.name!r}: {self.num_boxes} regions of a {self.image_width}x"
                f"{self.image_height} image, features {self.features.shape} {self.features.dtype})")

    def show(self, max_boxes: int = 36, min_conf: float = 0.0,
             min_attr_conf: float = 0.1) -> Image.Image:
        """The image with its regions drawn, as `pipeline show` draws a sample with the same
        settings (--max-boxes, --min-conf, --set min_attr_conf=): at most max_boxes boxes, the
        most confident first, those with object confidence >= min_conf, each labelled with its
        top attribute (above min_attr_conf), object name and confidence. A notebook shows the
        returned picture inline."""
        if self.source is None:
            raise ValueError(f"{self.name or 'these regions'}: no image to draw on (source=None)")
        # min_side 1: the image already passed extraction's size checks.
        bgr = read_image(self.source, self.name, PreprocessConfig(min_side=1))
        image = Image.fromarray(np.ascontiguousarray(bgr[..., ::-1]))
        order = drawing.regions_to_draw(self.object_conf, max_boxes, min_conf)
        return drawing.draw_labelled(image, self.arrays(), order, min_attr_conf)


@dataclass(frozen=True)
class ImageFailure:
    """An input that gave no regions (returned in its place with errors="return").

    index: its position in the call's inputs; source: the input as given; error: why, as
    `pipeline extract` records a failed image: "<name>: <kind>[: <detail>]".
    """

    index: int
    source: ImageInput = field(repr=False)
    error: str
