"""`pipeline bench scale --summary PNG --from JSON,...`: every cost earlier runs measured, in one
picture, against the size, with its fitted exponent.

Each --json file holds blocks of rows ("local", "s3", "extract", "extract_ray", "corpus", ...), a
row per size. The files' rows are merged by block and size (a size measured in two files: the
later file's row), each series drawn on log-log axes with k of cost ~ n^k in its label, and a
dotted line of slope 1 through each panel's first point: a cost that grows linearly runs
parallel to it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from pipeline.bench.growth import exponent

Value = Callable[[dict], float | None]


def _key(name: str) -> Value:
    return lambda row: row.get(name)


def _nested(name: str, key: str) -> Value:
    return lambda row: (row.get(name) or {}).get(key)


# (title, x label, [(block, the row's size field, the cost, series label)])
PANELS: tuple[tuple[str, str, list[tuple[str, str, Value, str]]], ...] = (
    ("listing a CC3M root (s)", "urls", [
        ("local", "urls", _key("list_s"), "local disk"),
        ("s3", "urls", _key("list_s"), "S3 (moto)"),
    ]),
    ("the driver's memory (MB)", "urls", [
        ("local", "urls", _key("driver_mb"), "listing + plan"),
        ("extract", "urls", _key("peak_mb"), "extraction, local engine (peak)"),
        ("extract_ray", "urls", _key("peak_mb"), "extraction, Ray (peak)"),
    ]),
    ("extraction (s)", "urls", [
        ("extract", "urls", _key("wall_s"), "local engine, disk"),
        ("extract_ray", "urls", _key("wall_s"), "Ray, disk"),
        ("extract_s3_local", "urls", _key("wall_s"), "local engine, S3"),
        ("extract_s3_ray", "urls", _key("wall_s"), "Ray, S3"),
        ("extract", "urls", _nested("verify", "wall_s"), "shards verify"),
        ("extract", "urls", _nested("export", "wall_s"), "shards export-tsv"),
    ]),
    ("S3 requests", "urls", [
        ("s3", "urls", _key("requests"), "listing"),
        ("extract_s3_local", "urls", _key("requests"), "extraction"),
    ]),
    ("pretraining's corpus (s)", "pairs or sentences", [
        ("corpus", "pairs", _key("read_s"), "read (load_pairs)"),
        ("build", "sentences", _key("wall_s"), "corpus build"),
        ("pretrain", "pairs", _key("driver_s"), "pretraining's driver (prepare_pretrain)"),
        ("pretrain", "pairs", _key("worker_s"), "a worker's pretrain_job"),
    ]),
    ("pretraining's corpus (MB)", "pairs or sentences", [
        ("corpus", "pairs", _key("table_mb"), "held (load_pairs)"),
        ("build", "sentences", _key("peak_mb"), "corpus build (peak)"),
        ("pretrain", "pairs", _key("driver_mb"), "pretraining's driver"),
        ("pretrain", "pairs", _key("worker_data_mb"), "a worker, less the model"),
    ]),
)


def merged_rows(paths: list[str]) -> dict[str, list[dict]]:
    """Block -> its rows from every file, one per size (the later file's), by size."""
    blocks: dict[str, dict[int, dict]] = {}
    for path in paths:
        for name, block in json.loads(Path(path).read_text()).items():
            if isinstance(block, dict) and "rows" in block:
                for row in block["rows"]:
                    size = row.get("urls") or row.get("sentences") or row.get("pairs")
                    blocks.setdefault(name, {})[size] = row
    return {name: [rows[size] for size in sorted(rows)] for name, rows in blocks.items()}


def series(rows: list[dict], size: str, value: Value) -> list[tuple[int, float]]:
    """(size, cost) of the rows that measured the cost."""
    return [(row[size], value(row)) for row in rows if row.get(size) and value(row)]


def plot_summary(paths: list[str], png: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = merged_rows(paths)
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    for ax, (title, xlabel, lines) in zip(axes.flat, PANELS):
        first = None
        for block, size, value, label in lines:
            points = series(blocks.get(block, []), size, value)
            if not points:
                continue
            k = exponent(points)
            x, y = zip(*points)
            ax.loglog(x, y, marker="o", label=label + (f" (k={k:.2f})" if k is not None else ""))
            first = first or (x[0], y[0], x[-1])
        ax.set_title(title)
        if not first:
            ax.text(0.5, 0.5, "not in these files", ha="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        x0, y0, x1 = first
        ax.loglog([x0, x1], [y0, y0 * x1 / x0], ":", color="grey", label="slope 1")
        ax.set_xlabel(xlabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
