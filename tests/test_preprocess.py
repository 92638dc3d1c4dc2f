"""Decoding real photos to BGR, every bad input we refuse, and the detector's resize."""

import io
import resource
import struct
import time
import zlib

import numpy as np
import pytest
import torch
from PIL import Image
from skimage import data as photos

from extractor.config import PreprocessConfig
from extractor.preprocess import (
    DecodedImage,
    ImageError,
    caffe_scale,
    decode_image,
    pad_batch,
    resize_image,
    resized_shape,
    resizes_on_device,
)


def encode(array_or_image, fmt="PNG", **kwargs) -> bytes:
    image = array_or_image
    if not isinstance(image, Image.Image):
        image = Image.fromarray(image)
    buffer = io.BytesIO()
    image.save(buffer, fmt, **kwargs)
    return buffer.getvalue()


def png_header_claiming(width, height) -> bytes:
    """A valid PNG signature and IHDR for an 8-bit grayscale width x height image, with only a few
    rows of (zero) data: tiny on disk, a bomb if anyone decodes it."""

    def chunk(kind, payload):
        checksum = struct.pack(">I", zlib.crc32(kind + payload))
        return struct.pack(">I", len(payload)) + kind + payload + checksum

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    rows = zlib.compress(b"\0" * (width + 1) * 4)
    signature = b"\x89PNG\r\n\x1a\n"
    return signature + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


# ---------------------------------------------------------------- colour and orientation


def test_decoded_channels_are_bgr():
    rgb = photos.astronaut()
    bgr = decode_image(encode(rgb), "astronaut.png")
    assert bgr.dtype == np.uint8 and bgr.shape == rgb.shape
    np.testing.assert_array_equal(bgr[..., 0], rgb[..., 2])  # blue first
    np.testing.assert_array_equal(bgr[..., 2], rgb[..., 0])
    assert not np.array_equal(bgr[..., 0], rgb[..., 0])  # the photo does tell the orders apart


@pytest.mark.parametrize("orientation, quarter_turns", [(6, -1), (8, 1)])
def test_exif_orientation_is_applied(orientation, quarter_turns):
    rgb = photos.coffee()  # 400 x 600, so a rotation changes the shape
    exif = Image.Exif()
    exif[0x0112] = orientation
    rotated = decode_image(encode(rgb, "JPEG", quality=95, exif=exif), "tagged.jpg")
    upright = decode_image(encode(rgb, "JPEG", quality=95), "plain.jpg")  # same JPEG pixel data
    assert rotated.shape == (600, 400, 3)
    np.testing.assert_array_equal(rotated, np.rot90(upright, k=quarter_turns))


def test_grayscale_is_replicated():
    gray = photos.camera()
    bgr = decode_image(encode(gray), "camera.png")
    assert bgr.shape == (*gray.shape, 3)
    for channel in range(3):
        np.testing.assert_array_equal(bgr[..., channel], gray)


def test_palette_with_and_without_transparency():
    paletted = Image.fromarray(photos.chelsea()).quantize(colors=32)
    indices = np.asarray(paletted)
    palette = np.array(paletted.getpalette()[: 32 * 3], dtype=np.uint8).reshape(32, 3)
    bgr = decode_image(encode(paletted), "chelsea_p.png")
    np.testing.assert_array_equal(bgr, palette[indices][..., ::-1])

    clear = int(indices[0, 0])
    bgr = decode_image(encode(paletted, transparency=clear), "chelsea_pt.png")
    transparent = indices == clear
    assert transparent.any() and not transparent.all()
    np.testing.assert_array_equal(bgr[transparent], 255)  # composited on white
    np.testing.assert_array_equal(bgr[~transparent], palette[indices][~transparent][:, ::-1])


def test_cmyk_primaries():
    cmyk = np.zeros((32, 32, 4), np.uint8)
    cases = [  # (C, M, Y, K) -> (R, G, B)
        ((255, 0, 0, 0), (0, 255, 255)),
        ((0, 255, 0, 0), (255, 0, 255)),
        ((0, 0, 255, 0), (255, 255, 0)),
        ((0, 0, 0, 255), (0, 0, 0)),
        ((0, 0, 0, 0), (255, 255, 255)),
        ((128, 0, 0, 0), (127, 255, 255)),
    ]
    for row, (value, _) in enumerate(cases):
        cmyk[row * 5 : row * 5 + 5] = value
    bgr = decode_image(encode(Image.fromarray(cmyk, "CMYK"), "TIFF"), "cmyk.tif")
    for row, (_, rgb) in enumerate(cases):
        np.testing.assert_array_equal(bgr[row * 5 + 2, 7], rgb[::-1], err_msg=f"row {row}")


def test_sixteen_bit_is_scaled_not_clipped():
    values = np.array([0, 257, 1000, 32896, 65535], np.uint16)
    image = np.tile(np.repeat(values, 8)[None], (20, 1))  # 20 x 40
    bgr = decode_image(encode(image), "depth16.png")
    # v / 257 rounded: 1000 -> 3.89 -> 4 (a byte shift would give 3, clipping 255).
    np.testing.assert_array_equal(bgr[0, ::8, 0], [0, 1, 4, 128, 255])
    assert (bgr[..., 0] == bgr[..., 2]).all()


def test_alpha_is_composited_on_white():
    rgba = np.zeros((20, 30, 4), np.uint8)
    rgba[:, :10] = (200, 100, 0, 255)  # opaque: unchanged
    rgba[:, 10:20] = (200, 100, 0, 0)  # transparent: white
    rgba[:, 20:] = (0, 0, 0, 128)  # half: 255 * 127 / 255 = 127
    bgr = decode_image(encode(rgba), "rgba.png")
    expected = [(0, 100, 200), (255, 255, 255), (127, 127, 127)]  # BGR
    np.testing.assert_array_equal(bgr[0, [0, 10, 20]], expected)
    la = np.stack([np.zeros((20, 20), np.uint8), np.full((20, 20), 0, np.uint8)], -1)
    la[:10, :, 1] = 255
    bgr = decode_image(encode(Image.fromarray(la, "LA")), "la.png")
    assert (bgr[:10] == 0).all() and (bgr[10:] == 255).all()


# ---------------------------------------------------------------- bad inputs


def test_error_names_the_file_and_the_reason():
    with pytest.raises(ImageError) as caught:
        decode_image(b"", "shard-7/0042.jpg")
    assert caught.value.path == "shard-7/0042.jpg" and "empty" in caught.value.reason
    assert "shard-7/0042.jpg" in str(caught.value) and caught.value.reason in str(caught.value)
    assert isinstance(caught.value, ValueError)


def garbage(size: int) -> bytes:
    """`size` random bytes, the same on every run."""
    return np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()


def jpeg_with_garbage_body() -> bytes:
    """A JPEG whose header (to its start-of-scan segment) is intact and whose compressed pixels
    are random bytes of the same length."""
    jpeg = encode(photos.rocket(), "JPEG")
    scan = jpeg.index(b"\xff\xda")
    body = scan + 2 + int.from_bytes(jpeg[scan + 2 : scan + 4], "big")
    return jpeg[:body] + garbage(len(jpeg) - body)


def png_with_garbage_pixels() -> bytes:
    """A PNG with valid chunks whose compressed pixels (IDAT) are partly random bytes."""
    png = bytearray(encode(photos.rocket(), "PNG"))
    start = png.index(b"IDAT") + 104
    png[start : start + 1900] = garbage(1900)
    return bytes(png)


def jpeg_with_text_for_a_number_in_exif() -> bytes:
    """A JPEG turned by its EXIF orientation whose EXIF ImageWidth tag holds text: PIL opens and
    decodes it, and fails writing the EXIF back as it turns the image."""
    exif = Image.Exif()
    exif[0x0112], exif[0x010F] = 6, "Maker"  # orientation 6; Make, ASCII (type 2)
    jpeg = bytearray(encode(photos.astronaut()[:64, :64], "JPEG", exif=exif))
    jpeg[jpeg.index(b"\x01\x0f\x00\x02") + 1] = 0x00  # Make (0x010F) -> ImageWidth (0x0100)
    return bytes(jpeg)


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: b"", "empty file (0 bytes)"),
        (lambda: b"<html>404 Not Found</html>\n", "not a recognised image format"),
        (lambda: encode(photos.rocket(), "JPEG")[:20000],
         "truncated JPEG data: image file is truncated (45 bytes not processed)"),
        (lambda: encode(photos.rocket(), "PNG")[:50000],
         "truncated PNG data: image file is truncated"),
        (lambda: encode(photos.rocket(), "JPEG")[:100],
         "truncated JPEG header: Truncated File Read"),
        (jpeg_with_garbage_body,
         "corrupt JPEG data: broken data stream when reading image file"),
        (png_with_garbage_pixels,
         "corrupt PNG data: broken data stream when reading image file"),
        (lambda: encode(photos.rocket(), "JPEG")[:3] + garbage(5000),
         "corrupt JPEG header: no marker found"),
        (lambda: encode(photos.rocket(), "PNG")[:8] + garbage(5000),
         "corrupt PNG header: broken PNG file (chunk b'\\xcf\\xeb\\x0f\\xa3')"),
        (jpeg_with_text_for_a_number_in_exif,
         "corrupt EXIF data: required argument is not an integer"),
        (lambda: png_header_claiming(20000, 20000),
         "decompression bomb: refused by PIL: Image size (400000000 pixels) exceeds limit of "
         "178956970 pixels, could be decompression bomb DOS attack."),
        (lambda: encode(np.zeros((1, 1, 3), np.uint8)),
         "too small: 1x1 is smaller than the minimum side of 16 px"),
        (lambda: encode(np.zeros((20, 4000, 3), np.uint8)),
         "aspect ratio too extreme: 4000x20 resizes to 1000x5, below the minimum side of 16 px"),
        (lambda: encode(Image.fromarray(np.zeros((20, 20), np.float32)), "TIFF"),
         "unsupported image mode: F (float samples have no agreed range)"),
    ],
    ids=["empty", "text-named-jpg", "truncated-jpeg", "truncated-png", "truncated-jpeg-header",
         "corrupt-jpeg", "corrupt-png", "corrupt-jpeg-header", "corrupt-png-header", "corrupt-exif",
         "bomb", "1x1", "20x4000", "float-tiff"],
)
def test_each_bad_input_has_its_own_reason(make, reason):
    """A file PIL recognises but cannot decode is corrupt (or truncated, when PIL runs out of
    bytes), never "not a recognised image format"; that is for bytes no format claims."""
    with pytest.raises(ImageError) as caught:
        decode_image(make(), "bad.jpg")
    assert caught.value.reason == reason
    assert str(caught.value) == f"bad.jpg: {reason}"


def test_a_format_this_pil_was_built_without_is_unsupported_not_unrecognised(monkeypatch):
    webp = encode(photos.rocket(), "WEBP")
    Image.init()
    factory, accept = Image.OPEN["WEBP"]
    # What PIL's WEBP plugin answers when PIL was built without libwebp.
    missing = "image file could not be identified because WEBP support not installed"
    monkeypatch.setitem(Image.OPEN, "WEBP", (factory, lambda prefix: accept(prefix) and missing))
    with pytest.warns(UserWarning, match=missing), pytest.raises(ImageError) as caught:
        decode_image(webp, "photo.webp")
    assert caught.value.reason == f"unsupported image format: {missing}"


def test_decompression_bomb_is_refused_from_the_header():
    bomb = png_header_claiming(20000, 20000)
    assert len(bomb) < 1000
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    start = time.perf_counter()
    with pytest.raises(ImageError, match="^bomb.png: decompression bomb: refused by PIL"):
        decode_image(bomb, "bomb.png")
    assert time.perf_counter() - start < 1.0
    # Decoding would need 400 MB; refusing from the header allocates nothing of the sort.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 100_000


def test_max_pixels_is_configurable():
    image = encode(np.zeros((300, 400, 3), np.uint8))
    assert decode_image(image, "ok.png").shape == (300, 400, 3)
    with pytest.raises(ImageError) as caught:
        decode_image(image, "big.png", PreprocessConfig(max_pixels=100_000))
    assert caught.value.reason == ("decompression bomb: 400x300 = 120000 pixels exceeds the limit "
                                   "of 100000 (preprocess.max_pixels)")


# ---------------------------------------------------------------- resize

SIZES = [  # photo, transposed, min_size, max_size, expected (h, w), worked out by hand
    ("astronaut", False, 600, 1000, (600, 600)),  # 512 * 600/512
    ("coffee", False, 600, 1000, (600, 900)),  # 600 * 1.5
    ("coffee", True, 600, 1000, (900, 600)),
    ("chelsea", False, 600, 1000, (600, 902)),  # 451 * 2
    ("rocket", False, 600, 1000, (600, 899)),  # 640 * 600/427 = 899.30
    ("rocket", True, 600, 1000, (899, 600)),
    ("astronaut", False, 800, 1333, (800, 800)),
    ("coffee", False, 800, 1333, (800, 1200)),
    ("coffee", True, 800, 1333, (1200, 800)),
    ("chelsea", False, 800, 1333, (800, 1203)),  # 451 * 8/3 = 1202.67
    ("rocket", True, 800, 1333, (1199, 800)),  # 640 * 800/427 = 1199.06
]


@pytest.mark.parametrize("name, transposed, min_size, max_size, expected", SIZES)
def test_resize_sizes_of_real_photos(name, transposed, min_size, max_size, expected):
    rgb = getattr(photos, name)()
    bgr = np.ascontiguousarray((rgb.transpose(1, 0, 2) if transposed else rgb)[..., ::-1])
    for method in ("pil", "torch"):
        cfg = PreprocessConfig(min_size=min_size, max_size=max_size, resize=method)
        prepared = resize_image(bgr, cfg)
        assert prepared.pixels.shape == (3, *expected) and prepared.pixels.dtype == torch.float32
        assert (prepared.orig_height, prepared.orig_width) == bgr.shape[:2]
        assert prepared.scale_y == expected[0] / bgr.shape[0]
        assert prepared.scale_x == expected[1] / bgr.shape[1]


@pytest.mark.parametrize(
    "height, width, min_size, max_size, expected",
    [
        (300, 1000, 600, 1000, (300, 1000)),  # the long side caps: scale 1000/1000
        (1000, 300, 600, 1000, (1000, 300)),
        (300, 1000, 800, 1333, (400, 1333)),  # 800 * 1333/2666.67 = 399.9
        (1000, 300, 800, 1333, (1333, 400)),
    ],
)
def test_resize_caps_the_long_side(height, width, min_size, max_size, expected):
    cfg = PreprocessConfig(min_size=min_size, max_size=max_size)
    assert resized_shape(height, width, cfg) == expected


@pytest.mark.parametrize("method", ["cv2", "pil", "torch"])
def test_resize_keeps_bgr_pixels(method):
    bgr = np.ascontiguousarray(photos.astronaut()[..., ::-1])
    prepared = resize_image(bgr, PreprocessConfig(min_size=512, max_size=512, resize=method))
    expected = bgr.transpose(2, 0, 1).astype(np.float32)
    np.testing.assert_array_equal(prepared.pixels.numpy(), expected)


def test_pil_and_torch_resize_agree_up_and_differ_down():
    bgr = np.ascontiguousarray(photos.coffee()[..., ::-1])
    up = [resize_image(bgr, PreprocessConfig(resize=m)).pixels for m in ("pil", "torch")]
    assert (up[0] - up[1]).abs().mean() < 1.0  # same bilinear kernel when enlarging
    big = np.ascontiguousarray(np.repeat(np.repeat(bgr, 3, axis=0), 3, axis=1))  # 1200 x 1800
    down = [resize_image(big, PreprocessConfig(resize=m)).pixels for m in ("pil", "torch")]
    assert down[0].shape == down[1].shape == (3, 600, 900)
    assert (down[0] - down[1]).abs().max() > 3  # PIL antialiases when shrinking, torch does not


def test_refuses_to_run_with_truncated_loading_switched_on(monkeypatch):
    from PIL import ImageFile

    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(RuntimeError, match="LOAD_TRUNCATED_IMAGES"):
        decode_image(encode(photos.rocket(), "JPEG")[:20000], "truncated.jpg")


@pytest.mark.parametrize("name, transposed", [("coffee", False), ("chelsea", True), ("rocket", False)])
@pytest.mark.parametrize("min_size, max_size", [(600, 1000), (300, 500), (800, 1333)])
def test_cv2_resize_is_caffes(name, transposed, min_size, max_size):
    """Caffe's _get_image_blob: one scale, the rounded long side capped, cv2 bilinear on float.

    OpenCV's own C++ path is the reference; its optional Intel IPP kernels are switched off (they
    round differently, up to ~0.007 grey levels, and are not what every build runs).
    """
    cv2 = pytest.importorskip("cv2")
    rgb = getattr(photos, name)()
    bgr = np.ascontiguousarray((rgb.transpose(1, 0, 2) if transposed else rgb)[..., ::-1])
    height, width = bgr.shape[:2]
    scale = min_size / min(height, width)
    if np.round(scale * max(height, width)) > max_size:
        scale = max_size / max(height, width)
    use_ipp = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    try:
        expected = cv2.resize(bgr.astype(np.float32), None, None, fx=scale, fy=scale,
                              interpolation=cv2.INTER_LINEAR)
    finally:
        cv2.ipp.setUseIPP(use_ipp)
    prepared = resize_image(bgr, PreprocessConfig(min_size=min_size, max_size=max_size, resize="cv2"))
    assert prepared.scale_y == prepared.scale_x == scale
    assert prepared.pixels.shape == (3, *expected.shape[:2])
    assert resized_shape(height, width, PreprocessConfig(min_size, max_size, "cv2")) == expected.shape[:2]
    np.testing.assert_allclose(prepared.pixels.numpy().transpose(1, 2, 0), expected, rtol=0, atol=1e-4)


def test_caffe_caps_the_rounded_long_side():
    """Caffe compares the long side after rounding: 5001 * 0.2 = 1000.2 rounds to 1000, not above
    the cap, so the scale stays 0.2 (detectron2 compares 1000.2 and shrinks by 1000 / 1000.2)."""
    caffe = PreprocessConfig(resize="cv2")
    assert caffe_scale(3000, 5001, caffe) == 0.2
    assert resized_shape(3000, 5001, caffe) == resized_shape(3000, 5001, PreprocessConfig()) == (600, 1000)
    assert caffe_scale(3000, 5003, caffe) == 1000 / 5003  # 1000.6 rounds to 1001: capped
    assert resized_shape(3000, 5003, caffe) == (600, 1000)
    assert caffe_scale(5001, 3000, caffe) == 0.2


def test_cv2_resize_is_cv2s_for_many_sizes_and_scales():
    """Up- and downscaling, odd sizes, both axes capped or not: our taps (computed on the host
    with numpy) and gathers give cv2's values to its last float32 bit. Exact equality fails here
    in ~0.04% of pixels by one bit: this machine's OpenCV build fuses a multiply and an add in
    its vectorised horizontal pass, which rounds once where the plain formula rounds twice."""
    cv2 = pytest.importorskip("cv2")
    rng = np.random.default_rng(0)
    use_ipp = cv2.ipp.useIPP()
    cv2.ipp.setUseIPP(False)
    try:
        for _ in range(40):
            height, width = (int(v) for v in rng.integers(16, 400, size=2))
            min_size = int(rng.integers(16, 500))
            cfg = PreprocessConfig(min_size=min_size, max_size=min_size + int(rng.integers(0, 300)),
                                   resize="cv2")
            bgr = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            scale = caffe_scale(height, width, cfg)
            expected = cv2.resize(bgr.astype(np.float32), None, None, fx=scale, fy=scale,
                                  interpolation=cv2.INTER_LINEAR)
            got = resize_image(bgr, cfg).pixels.permute(1, 2, 0).numpy()
            np.testing.assert_allclose(got, expected, rtol=2.0**-23, atol=0,
                                       err_msg=f"{height}x{width} {cfg}")
    finally:
        cv2.ipp.setUseIPP(use_ipp)


def test_a_decoded_image_resizes_to_the_same_bits_later():
    """Extraction on a GPU leaves the cv2 resize to the detector's device (DecodedImage); here on
    the CPU the deferred resize must equal the one done at decode time, bit for bit."""
    cfg = PreprocessConfig(resize="cv2")
    bgr = np.ascontiguousarray(photos.chelsea()[..., ::-1])
    now = resize_image(bgr, cfg)
    later = DecodedImage(torch.from_numpy(bgr), cfg).resized("cpu")
    assert torch.equal(later.pixels, now.pixels)
    assert (later.scale_y, later.scale_x, later.orig_height, later.orig_width) == (
        now.scale_y, now.scale_x, now.orig_height, now.orig_width)


@pytest.mark.parametrize("method", ["pil", "torch"])
def test_only_the_cv2_resize_is_left_to_a_device(method):
    """PIL's and F.interpolate's kernels differ between devices: they stay on the host."""
    cfg = PreprocessConfig(resize=method)
    assert not resizes_on_device(cfg) and resizes_on_device(PreprocessConfig(resize="cv2"))
    with pytest.raises(ValueError, match=f'resize "{method}" runs on the host only'):
        resize_image(np.zeros((40, 60, 3), np.uint8), cfg, device="cpu")


def test_pad_batch_pads_and_lays_out_as_asked():
    """Mean-subtracted images at the top left of zeros rounded up to the multiple, in the layout
    asked for (channels-last on a GPU, written in place: no second copy)."""
    gen = torch.Generator().manual_seed(0)
    pixels = [torch.rand(3, 5, 7, generator=gen) * 255,
              torch.randint(0, 256, (3, 8, 4), dtype=torch.uint8, generator=gen)]
    mean = torch.tensor([102.9801, 115.9465, 122.7717]).view(3, 1, 1)
    expected = np.zeros((2, 3, 8, 8), np.float32)
    for i, p in enumerate(pixels):
        _, h, w = p.shape
        expected[i, :, :h, :w] = p.numpy().astype(np.float32) - mean.numpy()
    plain = pad_batch(pixels, mean, 4)
    np.testing.assert_array_equal(plain.numpy(), expected)
    nhwc = pad_batch(pixels, mean, 4, memory_format=torch.channels_last)
    assert nhwc.is_contiguous(memory_format=torch.channels_last)
    np.testing.assert_array_equal(nhwc.numpy(), expected)
