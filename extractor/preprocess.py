"""Image decoding with explicit failures, and the detector's resize.

decode_image turns file bytes into a uint8 BGR array (the colour order of the Caffe model and of
cv2.imread) or raises ImageError naming the file and the reason; nothing is silently repaired.
resize_image applies the resize of the reference the preset follows: Caffe's cv2.resize of float
pixels by one scale factor (bottom-up-attention's _get_image_blob), or detectron2's
ResizeShortestEdge with PIL bilinear on uint8 (detectron2) or torch bilinear on float (the Hugging
Face demo).
"""

from __future__ import annotations

import io
import struct
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageFile, ImageOps

from extractor.canvases import round_up
from extractor.config import PreprocessConfig

# Modes whose alpha is composited on white; palette images only when they carry transparency.
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}
_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}


class ImageError(ValueError):
    """An input that cannot become a detector image: .path names it, .reason says why."""

    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass
class PreparedImage:
    """The resized image the detector consumes.

    pixels: (3, h, w) BGR, 0-255, not mean-subtracted; float32, or uint8 where the values are whole
        numbers (extraction ships resize "pil" images so: pipeline.extract.steps.ship_pixels).
    scale_y, scale_x: resized / original size per axis (boxes in original pixels = resized / scale).
    """

    pixels: torch.Tensor
    scale_y: float
    scale_x: float
    orig_height: int
    orig_width: int


@dataclass
class DecodedImage:
    """A decoded image whose resize is left to the detector's device (Extractor.submit does it
    there, where the cv2 resize gives the same bits; the host then only decodes).

    bgr: (H, W, 3) uint8 BGR, as decode_image returns it (pinned where a GPU will copy it).
    taps: where the resize samples, computed here on the host with the image (in a decoding
        thread), so that the device only gathers: a few kernels instead of dozens.
    """

    bgr: torch.Tensor
    cfg: PreprocessConfig
    scale: float = field(init=False)
    taps: Cv2Taps = field(init=False)

    def __post_init__(self):
        height, width = self.bgr.shape[:2]
        self.scale = caffe_scale(height, width, self.cfg)
        self.taps = Cv2Taps.of(height, width, self.scale)

    def pin(self) -> None:
        """Page-lock the pixels and taps, in place, so that their copies to a GPU do not block."""
        self.bgr = self.bgr.pin_memory()
        self.taps = self.taps.pin_memory()

    def resized(self, device: torch.device | str) -> PreparedImage:
        height, width = self.bgr.shape[:2]
        pixels = cv2_bilinear(self.bgr.to(device, non_blocking=True), self.scale,
                              self.taps.to(device))
        return PreparedImage(pixels, self.scale, self.scale, height, width)


def resizes_on_device(cfg: PreprocessConfig) -> bool:
    """Whether a resize can run on a GPU with the same result as on the host ("cv2": elementwise
    float32 products and sums; PIL's and F.interpolate's kernels differ between devices)."""
    return cfg.resize == "cv2"


def decode_image(data: bytes, path: str, cfg: PreprocessConfig = PreprocessConfig()) -> np.ndarray:
    """Decode image file bytes to a (H, W, 3) uint8 BGR array, EXIF orientation applied.

    Colour handling: grayscale is replicated to three channels; palette and CMYK go through PIL's
    RGB conversion; 16-bit grayscale is scaled to 8 bits (v / 257, rounded: 65535 -> 255); alpha
    (RGBA, LA, palette transparency) is composited on white, as a viewer shows a transparent
    PNG on a white page.

    Raises ImageError, its reason "<kind>" or "<kind>: <detail>" (extraction's summary counts
    failures by kind), the kinds being:
        empty file (0 bytes)
        not a recognised image format        no format PIL reads starts as these bytes do
        unsupported image format: ...        one does, but this PIL was built without it
        truncated {FORMAT} header|data: ...  PIL ran out of bytes (EOFError, or its message says
                                             truncated): the file is cut short, or a length in it
                                             points past its end
        corrupt {FORMAT} header|data: ...    PIL recognised the format (by its signature) but
                                             could not parse the header or decode the pixels
        corrupt EXIF data: ...               PIL fails applying the EXIF orientation
        decompression bomb: ...              more than cfg.max_pixels pixels, or more than PIL
                                             allows (checked from the header, before decoding)
        too small: ...                       a short side below cfg.min_side pixels
        aspect ratio too extreme: ...        a short side below cfg.min_side after the resize
        unsupported image mode: ...          float samples, or a mode PIL cannot make RGB
    Raises RuntimeError if PIL.ImageFile.LOAD_TRUNCATED_IMAGES was switched on, since PIL would
    then pad truncated files.
    """
    if not data:
        raise ImageError(path, "empty file (0 bytes)")
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is on: truncated files would be padded silently"
        )
    image = _open(data, path)
    width, height = image.size
    _check_pixels(path, height, width, cfg)
    _check_sides(path, height, width, cfg)
    try:
        image.load()  # decode now, so truncation raises here instead of being padded later
    except _PIL_ERRORS as exc:
        raise ImageError(path, _failure(image.format, "data", exc)) from exc
    return _oriented_bgr(image, path)


def image_to_bgr(
    image: Image.Image | np.ndarray | torch.Tensor, name: str,
    cfg: PreprocessConfig = PreprocessConfig(),
) -> np.ndarray:
    """An image already in memory -> (H, W, 3) uint8 BGR, as decode_image returns for its file.

    image: a PIL image (any mode decode_image accepts; its EXIF orientation applied), a numpy
        array (H, W, 3) RGB, (H, W, 4) RGBA or (H, W) grey, or a tensor (3, H, W) RGB, (4, H, W)
        RGBA or (H, W) grey (torchvision's layout); arrays and tensors must be uint8, 0-255. Alpha
        is composited on white, as decode_image does for a transparent file.
    name: how errors name the image. Raises ImageError as decode_image does for the sizes
    ("too small", "aspect ratio too extreme", "decompression bomb") and "unsupported dtype" /
    "unsupported shape" for arrays that are not uint8 RGB or grey.
    """
    if isinstance(image, Image.Image):
        width, height = image.size
        _check_pixels(name, height, width, cfg)
        _check_sides(name, height, width, cfg)
        return _oriented_bgr(image, name)
    if isinstance(image, torch.Tensor):
        if image.dtype != torch.uint8:
            raise ImageError(name, f"unsupported dtype {image.dtype}: expected torch.uint8, 0-255")
        if image.dim() == 3 and image.shape[0] not in (3, 4):
            raise ImageError(name, f"unsupported shape {tuple(image.shape)}: expected (3, H, W) "
                                   "RGB, (4, H, W) RGBA or (H, W) grey")
        image = image.permute(1, 2, 0) if image.dim() == 3 else image
        image = image.detach().cpu().numpy()
    elif image.dtype != np.uint8:
        raise ImageError(name, f"unsupported dtype {image.dtype}: expected uint8, 0-255")
    if image.ndim == 2:
        image = np.repeat(image[..., None], 3, axis=2)
    if image.ndim != 3 or image.shape[2] not in (3, 4):
        raise ImageError(name, f"unsupported shape {image.shape}: expected (H, W, 3) RGB, "
                               "(H, W, 4) RGBA or (H, W) grey")
    if image.shape[2] == 4:
        return image_to_bgr(Image.fromarray(np.ascontiguousarray(image), "RGBA"), name, cfg)
    height, width = image.shape[:2]
    _check_pixels(name, height, width, cfg)
    _check_sides(name, height, width, cfg)
    return np.ascontiguousarray(image[..., ::-1])


def _check_pixels(path: str, height: int, width: int, cfg: PreprocessConfig) -> None:
    if width * height > cfg.max_pixels:
        raise ImageError(
            path,
            f"decompression bomb: {width}x{height} = {width * height} pixels exceeds the limit of "
            f"{cfg.max_pixels} (preprocess.max_pixels)",
        )


def _oriented_bgr(image: Image.Image, path: str) -> np.ndarray:
    """(H, W, 3) uint8 BGR of a loaded PIL image, its EXIF orientation applied."""
    try:
        image = ImageOps.exif_transpose(image)
    except _PIL_ERRORS as exc:
        raise ImageError(path, f"corrupt EXIF data: {_message(exc)}") from exc
    return np.ascontiguousarray(_to_rgb(image, path)[..., ::-1])


# What PIL raises for bytes it cannot parse: its plugins' own errors, and the struct, index and
# type errors of reading fields that are not there (Image.open skips a format that raises those).
_PIL_ERRORS = (OSError, SyntaxError, ValueError, EOFError, IndexError, TypeError, struct.error)


def _open(data: bytes, path: str) -> Image.Image:
    """Image.open (reads the header only), its failures as ImageError (see decode_image)."""
    try:
        with warnings.catch_warnings():
            # Our max_pixels check replaces PIL's warning; PIL's own error (above twice
            # Image.MAX_IMAGE_PIXELS) still applies, so a larger max_pixels needs that raised too.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except Image.DecompressionBombError as exc:
        raise ImageError(path, f"decompression bomb: refused by PIL: {exc}") from exc
    except _PIL_ERRORS as exc:
        # PIL says only "cannot identify image file" when the format whose signature the bytes
        # carry fails to parse its header: that format, asked again, says why.
        raise ImageError(path, _header_failure(data) or "not a recognised image format") from exc


def _header_failure(data: bytes) -> str | None:
    """Why the first format whose signature `data` carries, and which fails to open it, fails, as
    a reason; None when there is none (no format's signature matches)."""
    prefix = data[:16]  # what Image.open shows each format's signature check
    Image.init()  # every format, as Image.open loads them all before it gives up
    for name in Image.ID:
        factory, accept = Image.OPEN[name]
        if accept is None:  # formats without a signature (TGA, ...) would claim any bytes
            continue
        claimed = accept(prefix)
        if isinstance(claimed, str):  # PIL's word that the format's library is not installed
            return f"unsupported image format: {claimed}"
        if claimed:
            try:
                factory(io.BytesIO(data), "")
            except _PIL_ERRORS as exc:
                return _failure(name, "header", exc)
    return None


def _failure(image_format: str | None, part: str, exc: BaseException) -> str:
    """"truncated JPEG data: <PIL's message>", or "corrupt ..." (see decode_image)."""
    message = _message(exc)
    truncated = isinstance(exc, EOFError) or "truncated" in message.lower()
    return f"{'truncated' if truncated else 'corrupt'} {image_format or 'image'} {part}: {message}"


def _message(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def prepare_image(
    image_bgr: np.ndarray, cfg: PreprocessConfig, device_resize: bool = False
) -> PreparedImage | DecodedImage:
    """A decoded (H, W, 3) uint8 BGR image as the Extractor takes it: resized here, or, with
    `device_resize` where the detector's device gives the same pixels (resizes_on_device), a
    DecodedImage whose resize Extractor.submit runs there."""
    if device_resize and resizes_on_device(cfg):
        return DecodedImage(torch.from_numpy(image_bgr), cfg)
    return resize_image(image_bgr, cfg)


def resize_image(
    image_bgr: np.ndarray | torch.Tensor, cfg: PreprocessConfig,
    device: torch.device | str | None = None,
) -> PreparedImage:
    """Resize a (H, W, 3) uint8 BGR image as the detector's preprocessing does.

    Shortest side to cfg.min_size unless the longest would exceed cfg.max_size (see
    resized_shape). resize="cv2": cv2.resize(INTER_LINEAR) of float pixels by one scale factor
    on both axes, as Caffe's test code (see cv2_bilinear); "pil": PIL bilinear on uint8, as
    detectron2's ResizeTransform; "torch": F.interpolate(bilinear, align_corners=False) on float,
    as the Hugging Face demo. Only PIL antialiases, so downscaling differs from the other two
    by several grey levels.

    device: where a "cv2" resize runs and its pixels stay (default: the image's own); the
    source is copied there without blocking (see resizes_on_device).
    """
    height, width = image_bgr.shape[:2]
    if cfg.resize == "cv2":
        image = torch.as_tensor(image_bgr)
        if device is not None:  # the taps computed here, the pixels and taps copied there
            return DecodedImage(image, cfg).resized(device)
        scale = caffe_scale(height, width, cfg)
        return PreparedImage(cv2_bilinear(image, scale), scale, scale, height, width)
    if device is not None and not resizes_on_device(cfg):
        raise ValueError(f'resize "{cfg.resize}" runs on the host only (see resizes_on_device)')
    image_bgr = np.asarray(image_bgr)
    new_height, new_width = resized_shape(height, width, cfg)
    if cfg.resize in ("pil", "maskrcnn"):
        resized = Image.fromarray(image_bgr).resize(
            (new_width, new_height), Image.Resampling.BILINEAR
        )
        pixels = torch.from_numpy(np.asarray(resized, dtype=np.float32).transpose(2, 0, 1).copy())
    else:
        chw = torch.from_numpy(image_bgr).permute(2, 0, 1).float()[None]
        pixels = F.interpolate(
            chw, size=(new_height, new_width), mode="bilinear", align_corners=False
        )[0]
    return PreparedImage(
        pixels=pixels,
        scale_y=new_height / height,
        scale_x=new_width / width,
        orig_height=height,
        orig_width=width,
    )


def pad_batch(pixels: Sequence[torch.Tensor], pixel_mean: torch.Tensor, multiple: int,
              device: torch.device | str = "cpu",
              memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    """Images (3, h, w) of any dtype -> (N, 3, H, W) float32 on `device`: each minus `pixel_mean`
    (3, 1, 1) at the top left, zero-padded to the largest size rounded up to `multiple`, laid
    out in `memory_format` (written there directly: no second pass to change the layout). The
    copies to the device do not block (pinned sources then overlap)."""
    height = round_up(max(p.shape[1] for p in pixels), multiple)
    width = round_up(max(p.shape[2] for p in pixels), multiple)
    batch = torch.empty(
        len(pixels), 3, height, width, device=device, memory_format=memory_format
    ).zero_()
    for i, image in enumerate(pixels):
        _, h, w = image.shape
        batch[i, :, :h, :w] = image.to(device, non_blocking=True).float() - pixel_mean
    return batch


def caffe_scale(height: int, width: int, cfg: PreprocessConfig) -> float:
    """Caffe's one scale factor: shortest side to min_size, unless the longest side, rounded,
    would exceed max_size (then longest side to max_size)."""
    scale = cfg.min_size / min(height, width)
    if round(scale * max(height, width)) > cfg.max_size:
        scale = cfg.max_size / max(height, width)
    return scale


def cv2_bilinear(image: torch.Tensor, scale: float, taps: Cv2Taps | None = None) -> torch.Tensor:
    """cv2.resize(image.astype(float32), None, fx=scale, fy=scale, INTER_LINEAR) as (3, h, w).

    image: (H, W, 3), any dtype (gathered before the float conversion), on any device. The output
    size is round(H * scale) x round(W * scale); each output pixel samples the source at
    (d + 0.5) / scale - 0.5 (half-pixel centres, the given scale, not the ratio of sizes),
    clamped to the border, weights in float32, a horizontal pass then a vertical one.
    Elementwise torch ops, each rounded once: the same bits on any thread count and device.
    taps: Cv2Taps.of(H, W, scale) on image's device, when computed beforehand (else here, and
        copied there).
    """
    height, width = image.shape[:2]
    if taps is None:
        taps = Cv2Taps.of(height, width, scale).to(image.device)
    x0, x1, wx0, wx1, y0, y1, wy0, wy1 = taps.split()
    # Planar (3, H, W) before the gathers: the same products and sums as interleaved pixels
    # (so the same bits), with one cheap uint8 transpose instead of a float32 one at the end.
    planes = image.permute(2, 0, 1).contiguous()
    rows = planes.index_select(2, x0).float().mul_(wx0)
    rows.add_(planes.index_select(2, x1).float().mul_(wx1))
    out = rows.index_select(1, y0).mul_(wy0[:, None])
    return out.add_(rows.index_select(1, y1).mul_(wy1[:, None]))


@dataclass
class Cv2Taps:
    """Where cv2's linear resize samples the source along both axes (_cv2_taps): the left and
    right source indices x0, x1, y0, y1 in one int64 tensor, their weights wx0, wx1, wy0, wy1 in
    one float32 tensor (two copies move them to a device); out_width / out_height long each."""

    index: torch.Tensor
    weight: torch.Tensor
    out_width: int
    out_height: int

    @classmethod
    def of(cls, height: int, width: int, scale: float) -> Cv2Taps:
        """The taps of an (height, width) image resized by `scale`, on the host."""
        x0, x1, wx0, wx1 = _cv2_taps(width, round(width * scale), scale)
        y0, y1, wy0, wy1 = _cv2_taps(height, round(height * scale), scale)
        index = torch.from_numpy(np.concatenate((x0, x1, y0, y1)))
        return cls(index, torch.from_numpy(np.concatenate((wx0, wx1, wy0, wy1))), len(x0), len(y0))

    def pin_memory(self) -> Cv2Taps:
        """A page-locked copy, which a GPU copies from without blocking."""
        return replace(self, index=self.index.pin_memory(), weight=self.weight.pin_memory())

    def to(self, device: torch.device | str) -> Cv2Taps:
        """On `device`, copied without blocking."""
        return replace(self, index=self.index.to(device, non_blocking=True),
                       weight=self.weight.to(device, non_blocking=True))

    def split(self) -> tuple[torch.Tensor, ...]:
        """x0, x1, wx0, wx1, y0, y1, wy0, wy1 (views)."""
        sizes = (self.out_width,) * 2 + (self.out_height,) * 2
        x0, x1, y0, y1 = self.index.split(sizes)
        wx0, wx1, wy0, wy1 = self.weight.split(sizes)
        return x0, x1, wx0, wx1, y0, y1, wy0, wy1


def _cv2_taps(size: int, out: int, scale: float) -> tuple[np.ndarray, ...]:
    """Source indices (left, right; int64) and float32 weights of cv2's linear resize along one
    axis. numpy, holding the GIL for a few microseconds: a decoding thread computes them while
    the detector's thread launches kernels. Each step is one IEEE operation, as in cv2."""
    pos = ((np.arange(out, dtype=np.float64) + 0.5) * (1.0 / scale) - 0.5).astype(np.float32)
    left = np.floor(pos)
    frac = pos - left
    left = left.astype(np.int64)
    frac = np.where((left < 0) | (left >= size - 1), np.float32(0.0), frac)
    left = left.clip(0, size - 1)
    return left, np.minimum(left + 1, size - 1), np.float32(1.0) - frac, frac


def resized_shape(height: int, width: int, cfg: PreprocessConfig) -> tuple[int, int]:
    """(new_height, new_width): Caffe's for resize="cv2", else detectron2's
    ResizeShortestEdge.get_output_shape."""
    if cfg.resize == "cv2":
        scale = caffe_scale(height, width, cfg)
        return round(height * scale), round(width * scale)
    if cfg.resize == "maskrcnn":
        return _maskrcnn_shape(height, width, cfg)
    scale = cfg.min_size / min(height, width)
    if height < width:
        new_height, new_width = float(cfg.min_size), scale * width
    else:
        new_height, new_width = scale * height, float(cfg.min_size)
    if max(new_height, new_width) > cfg.max_size:
        scale = cfg.max_size / max(new_height, new_width)
        new_height, new_width = new_height * scale, new_width * scale
    return int(new_height + 0.5), int(new_width + 0.5)


def _maskrcnn_shape(height: int, width: int, cfg: PreprocessConfig) -> tuple[int, int]:
    """maskrcnn_benchmark's Resize.get_size: the short side to min_size (or less, rounded, where
    the long side would pass max_size), the long side in proportion, truncated."""
    size = cfg.min_size
    short, long = float(min(height, width)), float(max(height, width))
    if long / short * size > cfg.max_size:
        size = round(cfg.max_size * short / long)
    if min(height, width) == size:
        return height, width
    if width < height:
        return int(size * height / width), size
    return size, int(size * width / height)


def _check_sides(path: str, height: int, width: int, cfg: PreprocessConfig) -> None:
    if min(height, width) < cfg.min_side:
        raise ImageError(
            path,
            f"too small: {width}x{height} is smaller than the minimum side of {cfg.min_side} px",
        )
    new_height, new_width = resized_shape(height, width, cfg)
    if min(new_height, new_width) < cfg.min_side:
        raise ImageError(
            path,
            f"aspect ratio too extreme: {width}x{height} resizes to {new_width}x{new_height}, "
            f"below the minimum side of {cfg.min_side} px",
        )


def _to_rgb(image: Image.Image, path: str) -> np.ndarray:
    """(H, W, 3) uint8 RGB from any PIL mode we accept."""
    mode = image.mode
    if mode == "F":
        raise ImageError(path, "unsupported image mode: F (float samples have no agreed range)")
    if mode in _SIXTEEN_BIT_MODES:
        # "I" holds 16-bit PNG/TIFF samples widened to int32; values outside 0..65535 are clipped.
        values = np.asarray(image).astype(np.int64).clip(0, 65535)
        gray = ((values + 128) // 257).astype(np.uint8)
        return np.repeat(gray[..., None], 3, axis=2)
    if mode == "P" and "transparency" in image.info:
        image, mode = image.convert("RGBA"), "RGBA"
    if mode in _ALPHA_MODES:
        rgba = np.asarray(image.convert("RGBA"), dtype=np.uint32)
        alpha = rgba[..., 3:]
        blended = (rgba[..., :3] * alpha + 255 * (255 - alpha) + 127) // 255
        return blended.astype(np.uint8)
    try:
        return np.asarray(image.convert("RGB"))
    except ValueError as exc:
        raise ImageError(path, f"unsupported image mode: {mode}") from exc


def scale_boxes(boxes_xyxy_abs: np.ndarray | torch.Tensor, image: PreparedImage) -> torch.Tensor:
    """(K, 4) boxes in original pixels -> float32 input pixels of the resized `image`: x times
    scale_x, y times scale_y, as the Extractor maps given boxes."""
    scale = torch.tensor((image.scale_x, image.scale_y, image.scale_x, image.scale_y),
                         dtype=torch.float32)
    return torch.as_tensor(boxes_xyxy_abs, dtype=torch.float32).view(-1, 4) * scale


def flip_boxes(boxes: torch.Tensor, width: float) -> torch.Tensor:
    """Boxes (..., 4) x1 y1 x2 y2 of an image `width` pixels wide -> the same boxes in the image
    flipped left to right (column x -> width - 1 - x): x1' = width - x2, x2' = width - x1.

    Flip input boxes with the resized width (image.pixels.shape[-1]), after scale_boxes: the
    pixels flipped are the resized ones.
    """
    x1, y1, x2, y2 = boxes.unbind(-1)
    return torch.stack((width - x2, y1, width - x1, y2), dim=-1)
