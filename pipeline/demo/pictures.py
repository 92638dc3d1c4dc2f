"""The two pictures `pipeline demo` draws for one VQA (or GQA) example of a fine-tuned LXMERT run.

boxes.png: the image with the regions the model saw (outlined and labelled as `pipeline show`
draws them) and a caption: the question, the model's answer with its probability, and the
ground-truth answer.
attention.png: the image darkened except where the question looks: each region is lit by its
share of the attention the question's words give the regions in the last cross-modality layer;
the most attended region is outlined with its share, and the caption lists the top three.

Both pictures are the image (its own pixels, EXIF orientation applied) with a white caption
strip below it: as wide as the image, taller by the strip.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFont

from extractor.config import PreprocessConfig
from extractor.preprocess import ImageError, decode_image
from model.lxmert import LxmertModel
from model.tasks import joint_outputs
from pipeline.analyze.pictures import wrap_text
from pipeline.extract.show import (
    RGB,
    ShowConfig,
    ShowError,
    box_colors,
    draw_regions,
    region_labels,
    select_regions,
)
from pipeline.finetune.examples import Example
from pipeline.finetune.objective import AnswerTask
from pipeline.finetune.run_model import RunModel, load_run_model
from shards.schema import Sample

BOXES_FILE = "boxes.png"
ATTENTION_FILE = "attention.png"
TOP_REGIONS = 3
# draw_regions colours a lone box with box_colors(1)[0]: the focus region's outline and bar.
FOCUS_COLOR = box_colors(1)[0]
OTHER_BAR_COLOR = (150, 150, 150)


@dataclass(frozen=True)
class ExampleReading:
    """What the model made of one example.

    answer: the arg-max answer. probability: the sigmoid of its logit (the head is trained with
    BCE, so each answer gets its own probability, not a share of a softmax). truth: the answer
    most annotators gave (the first of a tie); None for unannotated (test) questions.
    shares: (N,) float64 over the N regions the model saw (the sample's first data.max_boxes):
    the last cross-modality layer's language -> vision attention, averaged over the heads and the
    question's wordpieces ([CLS], [SEP] and padding left out); each wordpiece's attention sums to
    1 over the regions, so the shares do too.
    """

    question: str
    answer: str
    probability: float
    truth: str | None
    shares: np.ndarray

    @property
    def focus(self) -> int:
        """The region the question attends to most."""
        return int(np.argmax(self.shares))


def read_example(run: RunModel, example: Example, sample: Sample) -> ExampleReading:
    """Answer `example` (one image, `sample`) with `run`'s model and read its attention.

    Only LXMERT runs: the other encoders have no cross-modality layer whose attention goes from
    the words to the regions (ValueError).
    """
    encoder = run.model.encoder
    if not isinstance(encoder, LxmertModel):
        raise ValueError(
            f"attention pictures need an LXMERT run, whose cross-modality layers attend from the "
            f"question's words to the regions; this run's encoder is {type(encoder).__name__} "
            f"(arch {run.config.arch})"
        )
    if not isinstance(run.objective, AnswerTask):
        raise ValueError(f"attention pictures need a VQA or GQA run, not {run.config.task}")
    if sample.num_boxes == 0:
        raise ShowError(f"{sample.key} has no regions to draw")
    inputs = run.objective.make_batch([example], [(sample,)]).inputs
    with torch.no_grad():
        out = encoder(**inputs, output_attentions=True)
        logits = run.model.head(joint_outputs(out)[0])[0]  # (A,)
    tokenizer = run.objective.tokenizer
    input_ids = inputs["input_ids"][0]  # (T,)
    special = torch.tensor(tokenizer.all_special_ids)
    words = inputs["attention_mask"][0].bool() & ~torch.isin(input_ids, special)  # (T,)
    if not words.any():
        raise ValueError(f"question {example.id} ({example.sentence!r}) has no wordpieces")
    to_regions = out.attentions.cross_text_to_visual[-1][0]  # (heads, T, N)
    shares = to_regions[:, words].double().mean(dim=(0, 1))  # (N,)
    shares = shares[inputs["region_mask"][0].bool()]
    best = int(logits.argmax())
    truth = max(example.answers, key=example.answers.get) if example.answers else None
    return ExampleReading(
        question=example.sentence,
        answer=run.vocab.answers[best],
        probability=float(torch.sigmoid(logits[best].double())),
        truth=truth,
        shares=shares.numpy(),
    )


def write_example_pictures(run_dir: Path, example: Example, sample: Sample, image_bytes: bytes,
                           out_dir: Path, *, checkpoint: Path | None = None,
                           show: ShowConfig = ShowConfig()) -> list[Path]:
    """Write boxes.png and attention.png (module docstring) for `example` into `out_dir`.

    run_dir: a `pipeline finetune` VQA / GQA run of LXMERT (weights of `checkpoint`, default the
    latest). sample: the shard sample of the example's image; image_bytes: that image's file, as
    `pipeline.extract.show.sample_image` reads it. show: which regions boxes.png draws (the most
    confident first) and when a label names an attribute. Returns [boxes.png, attention.png].
    """
    image = _decode(image_bytes, sample)
    reading = read_example(load_run_model(run_dir, checkpoint), example, sample)
    seen = len(reading.shares)
    boxes = sample.arrays["boxes"][:seen]  # (N, 4) x1 y1 x2 y2, pixels
    order = select_regions(sample.arrays["object_conf"][:seen], show.max_boxes, show.min_conf)
    drawn = draw_regions(image, boxes[order], region_labels(sample, order, show.min_attr_conf))
    truth = "none (no annotations)" if reading.truth is None else reading.truth
    caption = [f"Q: {reading.question}",
               f"model: {reading.answer} (p = {reading.probability:.2f})",
               f"truth: {truth}"]

    focus, share = reading.focus, reading.shares[reading.focus]
    names = [_region_name(sample, k, show.min_attr_conf) for k in range(seen)]
    lit = draw_regions(_light(image, boxes, reading.shares), boxes[[focus]],
                       [f"{names[focus]} {share:.0%}"])
    top = np.argsort(-reading.shares, kind="stable")[:TOP_REGIONS]
    legend = [(f"{reading.shares[k]:.1%} {names[k]}", reading.shares[k] / share,
               FOCUS_COLOR if k == focus else OTHER_BAR_COLOR) for k in top]
    heading = [f"Q: {reading.question}",
               "attention of its words to the regions (last cross-modality layer):"]

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / BOXES_FILE, out_dir / ATTENTION_FILE]
    _with_caption(drawn, caption, []).save(paths[0])
    _with_caption(lit, heading, legend).save(paths[1])
    return paths


def _decode(image_bytes: bytes, sample: Sample) -> Image.Image:
    source = f"the image of {sample.key}"
    try:
        # min_side 1: the sample exists, so its image already passed extraction's size checks.
        bgr = decode_image(image_bytes, source, PreprocessConfig(min_side=1))
    except ImageError as err:
        raise ShowError(str(err)) from err
    image = Image.fromarray(np.ascontiguousarray(bgr[..., ::-1]))
    size = (sample.meta["width"], sample.meta["height"])
    if image.size != size:
        raise ShowError(
            f"{source} is {image.width}x{image.height} but {sample.key} was extracted from a "
            f"{size[0]}x{size[1]} image: not the same image, so its boxes would not line up"
        )
    return image


def _region_name(sample: Sample, index: int, min_attr_conf: float) -> str:
    # region_labels ends with the detector's confidence, which would read as an attention share.
    return region_labels(sample, np.array([index]), min_attr_conf)[0].rsplit(" ", 1)[0]


def _light(image: Image.Image, boxes_xyxy_abs: np.ndarray, shares: np.ndarray) -> Image.Image:
    """The image at 20% brightness, lit inside each box up to full brightness in proportion to
    its share / the largest share. Where boxes overlap, the larger share lights the pixel (a
    maximum, not a sum), so the brightest box is the focus region however many boxes overlap."""
    pixels = np.asarray(image.convert("RGB"), dtype=np.float64)  # (H, W, 3)
    height, width = pixels.shape[:2]
    light = np.zeros((height, width))
    for (x1, y1, x2, y2), share in zip(np.rint(boxes_xyxy_abs).astype(int), shares):
        region = light[max(y1, 0):min(y2, height), max(x1, 0):min(x2, width)]
        np.maximum(region, share / shares.max(), out=region)
    lit = pixels * (0.2 + 0.8 * light)[..., None]
    return Image.fromarray(np.rint(lit).astype(np.uint8))


def _with_caption(image: Image.Image, lines: list[str],
                  bars: list[tuple[str, float, RGB]]) -> Image.Image:
    """`image` above a white strip of `lines` (wrapped to the image's width), then one row per
    bar: a bar of its fraction of a quarter of the width, in its colour, and its text."""
    width = image.width
    font = ImageFont.load_default(size=max(10, round(min(image.size) / 35)))
    measure = ImageDraw.Draw(image)
    line_h = round(font.size * 1.3)
    pad = max(2, font.size // 3)
    rows = [row for line in lines for row in wrap_text(measure, line, font, width - 2 * pad)]
    bar_w = width // 4
    canvas = Image.new("RGB", (width, image.height + pad * 2 + line_h * (len(rows) + len(bars))),
                       (255, 255, 255))
    canvas.paste(image.convert("RGB"), (0, 0))
    draw = ImageDraw.Draw(canvas)
    y = image.height + pad
    for row in rows:
        draw.text((pad, y), row, fill=(0, 0, 0), font=font)
        y += line_h
    for text, fraction, color in bars:
        bar_h = max(2, font.size * 2 // 3)
        top = y + (line_h - bar_h) // 2
        draw.rectangle((pad, top, pad + max(1, round(fraction * bar_w)), top + bar_h), fill=color)
        draw.text((2 * pad + bar_w, y), text, fill=(0, 0, 0), font=font)
        y += line_h
    return canvas
