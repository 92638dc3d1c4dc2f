"""The pictures of a grounding report (report.py): Li et al. 2020's Figure 3 as a heatmap, their
Table 2 as bars, and a few captions with the box the best head chose.

heatmap.png: entity grounding accuracy, layers as rows and heads (1-based) as columns, each cell
with its value; inactive heads (<= 20% of their attention on the regions) hatched and washed
out. Beside it the paper's own Figure 3: per layer, one dot per head (active large and dark,
inactive small and light), the most-confident-detection baseline a grey line.
relations.png: for the most frequent relations, the best active head's accuracy (the best of all
heads, starred, where none is active) beside the baseline.
example_NN.png: the image with the ground-truth box (green) and the region the best entity head
attends to most (red, dashed: where the two coincide the green shows between the dashes), and a
white strip below with the caption, the phrase and whether the head was right (IoU >= 0.5).
The examples are drawn with PIL alone, so their pixels are the image's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from pipeline.analyze.grounding import ACTIVE_SHARE, IOU_THRESHOLD, box_ious

if TYPE_CHECKING:  # run.py pulls in the model and the tokenizer; the pictures need neither
    from pipeline.analyze.run import GroundingExample

HEATMAP_FILE = "heatmap.png"
RELATIONS_FILE = "relations.png"
EXAMPLE_FILE = "example_{:02d}.png"  # numbered by the example's place in the list, from 1
MAX_ANNOTATED_HEADS = 16  # more columns than this leave no room for the numbers in the cells
TRUTH_COLOR = (0, 200, 0)
CHOSEN_COLOR = (230, 0, 0)
BASELINE_COLOR = "0.55"
DPI = 110

ImageLoader = Callable[[str], "Image.Image | None"]


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _name(head: dict) -> str:
    return f"{head['layer']}-{head['head']}"


def draw_heatmap(report: dict, path: str | Path) -> Path:
    """Write heatmap.png's picture (module docstring) of report["entity"] to `path`."""
    plt = _pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch, Rectangle

    entity = report["entity"]
    layers = list(report["layers"])
    accuracy = np.asarray(entity["accuracy"], dtype=np.float64).reshape(len(layers), -1)  # (L, H)
    active = np.asarray(entity["active"], dtype=bool).reshape(accuracy.shape)  # (L, H)
    n_layers, n_heads = accuracy.shape
    baseline = float(entity["baseline"])
    vmax = max(1.0, float(accuracy.max()), baseline)

    width = 0.6 * max(n_heads, 2) + 2.5 + 4.0  # heatmap and colour bar, then the side panel
    height = 0.45 * max(n_layers, 2) + 2.2
    fig, (ax, side) = plt.subplots(
        1, 2, figsize=(width, height), layout="constrained",
        gridspec_kw={"width_ratios": [0.6 * max(n_heads, 2) + 1.0, 4.0]})
    image = ax.imshow(accuracy, cmap="viridis", vmin=0.0, vmax=vmax, aspect="auto")
    wash = dict(facecolor=(1, 1, 1, 0.45), edgecolor=(1, 1, 1, 0.8), hatch="///", linewidth=0)
    for i, j in zip(*np.nonzero(~active)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **wash))
    if n_heads <= MAX_ANNOTATED_HEADS:
        size = 8 if n_heads <= 8 else 6
        for i in range(n_layers):
            for j in range(n_heads):
                dark = accuracy[i, j] / vmax < 0.6 and active[i, j]
                ax.text(j, i, f"{accuracy[i, j]:.1f}", ha="center", va="center", fontsize=size,
                        color="white" if dark else "black")
    ax.set_xticks(range(n_heads), [str(j + 1) for j in range(n_heads)])
    ax.set_yticks(range(n_layers), layers)
    ax.set(xlabel="head", ylabel="layer")
    fig.colorbar(image, ax=ax, label="entity grounding accuracy (%)", shrink=0.9)
    fig.get_layout_engine().set(wspace=0.1)  # the colour bar's label clears the side panel

    rows = np.repeat(np.arange(n_layers), n_heads).reshape(accuracy.shape)  # (L, H)
    side.scatter(accuracy[~active], rows[~active], s=12, color="C0", alpha=0.3, linewidths=0)
    side.scatter(accuracy[active], rows[active], s=40, color="C0", alpha=1.0, linewidths=0)
    side.axvline(baseline, color=BASELINE_COLOR, lw=1.5)
    side.set_ylim(n_layers - 0.5, -0.5)
    side.set_yticks(range(n_layers), layers)
    side.set_xlim(0, vmax * 1.05)
    side.set(xlabel="accuracy (%)", title="per layer, one dot per head")
    side.grid(axis="x", alpha=0.3)

    best = entity["best"]
    fig.suptitle(
        f"entity grounding ({entity.get('count', '?')} entities): best {_name(best)} "
        f"{best['accuracy']:.1f}% vs most-confident-detection baseline {baseline:.1f}%",
        fontsize=10)
    share = f"{ACTIVE_SHARE:.0%}"
    handles = [
        Line2D([], [], ls="", marker="o", ms=7, color="C0",
               label=f"active head (> {share} of its attention on the regions)"),
        Line2D([], [], ls="", marker="o", ms=4, color="C0", alpha=0.3, label="inactive head"),
        Patch(facecolor="0.75", edgecolor="white", hatch="///", label="inactive (heatmap)"),
        Line2D([], [], color=BASELINE_COLOR, lw=1.5, label="baseline"),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncol=2, fontsize=8, frameon=False)
    path = Path(path)
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def draw_relations(report: dict, path: str | Path, top: int = 10) -> bool:
    """Write relations.png's picture (module docstring) of the `top` most frequent relations
    of report["syntactic"] to `path`; False, and nothing written, when there are none."""
    relations = list(report.get("syntactic", {}).items())[:top]
    if not relations:
        return False
    plt = _pyplot()
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(max(5.0, 1.2 * len(relations) + 2.0), 4.5),
                           layout="constrained")
    x = np.arange(len(relations))
    bar_w = 0.38
    heads = [group.get("best_active") or group["best"] for _, group in relations]
    head_acc = [h["accuracy"] for h in heads]
    base_acc = [group["baseline"] for _, group in relations]
    ax.bar(x - bar_w / 2, head_acc, bar_w, color="C0")
    ax.bar(x + bar_w / 2, base_acc, bar_w, color=BASELINE_COLOR)
    for k, ((name, group), head) in enumerate(zip(relations, heads)):
        star = "" if group.get("best_active") else "*"
        ax.text(x[k] - bar_w / 2, head["accuracy"], f"{_name(head)}{star}\n{head['accuracy']:.1f}",
                ha="center", va="bottom", fontsize=7)
        ax.text(x[k] + bar_w / 2, group["baseline"], f"{group['baseline']:.1f}",
                ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{name}\nn={group['count']}" for name, group in relations], fontsize=8)
    ax.set_ylim(0, max(1.0, *head_acc, *base_acc) * 1.2)
    ax.set(ylabel="syntactic grounding accuracy (%)",
           title=f"the {len(relations)} most frequent relations: best active head vs baseline")
    ax.legend(handles=[Patch(color="C0", label="best active head (layer-head; * none active: "
                                               "best of all heads)"),
                       Patch(color=BASELINE_COLOR, label="most-confident-detection baseline")],
              fontsize=8, loc="upper right")
    fig.savefig(Path(path), dpi=DPI)
    plt.close(fig)
    return True


def best_entity_head(report: dict) -> tuple[int, int]:
    """(layer index into report["layers"], head index from 0) of report["entity"]["best"]."""
    best = report["entity"]["best"]
    return list(report["layers"]).index(best["layer"]), int(best["head"]) - 1


def draw_examples(examples: Sequence[GroundingExample], report: dict, image_loader: ImageLoader,
                  directory: str | Path) -> list[Path]:
    """Write example_NN.png (module docstring; NN the example's place in `examples`, from 1) for
    each example whose image `image_loader(image_key)` finds (None: skipped), with the region
    the report's best entity head chose. Returns the paths written."""
    directory = Path(directory)
    layer, head = best_entity_head(report)
    head_name = _name(report["entity"]["best"])
    written = []
    for number, example in enumerate(examples, start=1):
        image = image_loader(example.image_key)
        if image is None:
            continue
        regions = np.asarray(example.regions, dtype=np.float64).reshape(-1, 4)  # (N, 4) pixels
        chosen = int(example.choices[layer, head])
        iou = float(box_ious(regions[chosen], np.asarray(example.case.box))[0])
        right = iou >= IOU_THRESHOLD
        picture = image.convert("RGB")
        draw = ImageDraw.Draw(picture)
        line = max(2, round(min(picture.size) / 150))
        _outline(draw, example.case.box, TRUTH_COLOR, line, picture.size)
        _outline(draw, regions[chosen], CHOSEN_COLOR, line, picture.size, dash=4 * line)
        lines = [f"caption: {example.caption}",
                 f"phrase: \"{example.case.text}\"",
                 f"best entity head {head_name}: {'right' if right else 'wrong'} "
                 f"(IoU {iou:.2f} with the ground truth; right at >= {IOU_THRESHOLD})",
                 "green: ground-truth box; red dashed: the region the head attends to most"]
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / EXAMPLE_FILE.format(number)
        _with_caption(picture, lines).save(path)
        written.append(path)
    return written


def draw_all(report: dict, examples: Sequence[GroundingExample], image_loader: ImageLoader,
             directory: str | Path) -> list[Path]:
    """heatmap.png, relations.png (when the report has relations) and the examples' pictures
    in `directory` (made if missing). Returns the paths written."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = [draw_heatmap(report, directory / HEATMAP_FILE)]
    if draw_relations(report, directory / RELATIONS_FILE):
        written.append(directory / RELATIONS_FILE)
    return written + draw_examples(examples, report, image_loader, directory)


def _outline(draw: ImageDraw.ImageDraw, box, color: tuple[int, int, int], width: int,
             size: tuple[int, int], dash: int | None = None) -> None:
    """Outline box [x1, y1, x2, y2] (continuous pixels: it covers columns x1..x2-1) inside its
    edges, `width` pixels thick, clipped to the image; dashed from each corner when `dash`."""
    x1, y1, x2, y2 = np.rint(np.asarray(box, dtype=np.float64)).astype(int).tolist()
    x1, y1 = max(x1, 0), max(y1, 0)
    x2, y2 = min(x2, size[0]) - 1, min(y2, size[1]) - 1
    if x2 < x1 or y2 < y1:
        return
    w = min(width, x2 - x1 + 1, y2 - y1 + 1)
    edges = [(x1, y1, x2, y1 + w - 1), (x1, y2 - w + 1, x2, y2),  # top, bottom
             (x1, y1, x1 + w - 1, y2), (x2 - w + 1, y1, x2, y2)]  # left, right
    for left, top, right, bottom in edges:
        if dash is None:
            draw.rectangle((left, top, right, bottom), fill=color)
            continue
        horizontal = right - left >= bottom - top
        start, end = (left, right) if horizontal else (top, bottom)
        for a in range(start, end + 1, 2 * dash):
            b = min(a + dash - 1, end)
            draw.rectangle((a, top, b, bottom) if horizontal else (left, a, right, b), fill=color)


def _with_caption(image: Image.Image, lines: list[str]) -> Image.Image:
    """`image` above a white strip of `lines`, wrapped to the image's width."""
    font = ImageFont.load_default(size=max(10, round(min(image.size) / 35)))
    measure = ImageDraw.Draw(image)
    line_h = round(font.size * 1.3)
    pad = max(2, font.size // 3)
    rows = [row for line in lines for row in wrap_text(measure, line, font, image.width - 2 * pad)]
    canvas = Image.new("RGB", (image.width, image.height + 2 * pad + line_h * len(rows)),
                       (255, 255, 255))
    canvas.paste(image, (0, 0))
    draw = ImageDraw.Draw(canvas)
    for k, row in enumerate(rows):
        draw.text((pad, image.height + pad + k * line_h), row, fill=(0, 0, 0), font=font)
    return canvas


def wrap_text(draw: ImageDraw.ImageDraw, text: str, font, width: int) -> list[str]:
    """`text` in lines no wider than `width` pixels, broken at spaces (a longer word stands alone
    and is cut off at the edge)."""
    rows: list[str] = []
    for word in text.split():
        if rows and draw.textlength(f"{rows[-1]} {word}", font=font) <= width:
            rows[-1] = f"{rows[-1]} {word}"
        else:
            rows.append(word)
    return rows or [""]
