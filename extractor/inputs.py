"""Images as a Python caller gives them (a path, a PIL image, a numpy array, a tensor) -> the
(H, W, 3) uint8 BGR pixels that `pipeline extract` decodes from the same image's file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import numpy as np
import torch
from PIL import Image

from extractor.config import PreprocessConfig
from extractor.preprocess import ImageError, decode_image, image_to_bgr

# A path (str or PathLike), a PIL image, a numpy array (H, W, 3) RGB or a tensor (3, H, W) RGB,
# uint8 (or grey, or RGBA: preprocess.image_to_bgr).
ImageInput = Union[str, os.PathLike, Image.Image, np.ndarray, torch.Tensor]


def describe(item: ImageInput, index: int) -> str:
    """How errors and records name input `index`: a path as given, else its index and kind, e.g.
    "image 2 (numpy array (480, 640, 3))"."""
    if isinstance(item, (str, os.PathLike)):
        return str(item)
    if isinstance(item, Image.Image):
        return f"image {index} (PIL image {item.width}x{item.height} {item.mode})"
    if isinstance(item, (np.ndarray, torch.Tensor)):
        kind = "numpy array" if isinstance(item, np.ndarray) else "tensor"
        return f"image {index} ({kind} {tuple(item.shape)})"
    return f"image {index} ({type(item).__name__})"


def read_image(item: ImageInput, name: str, cfg: PreprocessConfig) -> np.ndarray:
    """(H, W, 3) uint8 BGR of one input, named `name` in errors. A file is read and decoded as
    `pipeline extract` decodes it (decode_image), an image in memory converted as its file would
    be (image_to_bgr). Raises ImageError "<name>: <kind>[: <detail>]", the kinds of decode_image,
    "unreadable" (a file that cannot be read) and "unsupported input" (another type)."""
    if isinstance(item, (str, os.PathLike)):
        try:
            data = Path(item).read_bytes()
        except OSError as err:  # in the words the CLI records
            raise ImageError(name, f"unreadable: {err.strerror or err}") from err
        return decode_image(data, name, cfg)
    if isinstance(item, (Image.Image, np.ndarray, torch.Tensor)):
        return image_to_bgr(item, name, cfg)
    raise ImageError(name, f"unsupported input {type(item).__name__}: expected a path, a PIL "
                           "image, a numpy array or a tensor")
