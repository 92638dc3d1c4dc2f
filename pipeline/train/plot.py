"""`pipeline plot RUN_DIR`: a run's loss curves and accuracies in one PNG, from metrics.jsonl."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.train.logs import read_metrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

PLOT_NAME = "loss_curves.png"
HELP = "loss curves of a pretraining or fine-tuning run as a PNG"
DESCRIPTION = (
    "Draw a run's training losses, validation losses and validation accuracies by step from its "
    "metrics.jsonl into one PNG (training writes RUN/loss_curves.png itself when it ends)."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="a run directory (holding metrics.jsonl)")
    parser.add_argument("--out", help="PNG to write (default: RUN/loss_curves.png)")


def run(args: argparse.Namespace) -> int:
    try:
        print(plot_run(args.run, args.out))
    except (FileNotFoundError, ValueError) as err:
        print(f"pipeline plot: {err}", file=sys.stderr)
        return 2
    return 0


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Draw loss_figure of RUN_DIR's metrics.jsonl into `out` (default RUN_DIR/loss_curves.png)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not any(r.get("split", "train") in ("train", "val") for r in records):
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no records to plot")
    target = Path(out) if out is not None else run_dir / PLOT_NAME
    loss_figure(records, run_dir.name).savefig(target, dpi=110)
    return target


_NOT_ACCURACIES = {"step", "epoch", "split", "pairs"}


def loss_figure(records: list[dict], title: str) -> Figure:
    """Left: the total and per-task training losses (lines) and validation losses (dots) by step.
    Right: validation accuracies by step. Each legend stands right of its axes, outside them: a
    run has up to a dozen curves, and a legend inside would hide some of them wherever it went.
    """
    # A Figure without pyplot: no global figure to close, and no GUI backend to choose.
    from matplotlib.figure import Figure

    train = [r for r in records if r.get("split", "train") == "train"]
    val = [r for r in records if r.get("split") == "val"]
    losses = sorted({k for r in records for k in r if k == "loss" or k.startswith("loss_")})
    # every validation figure that is not a loss: pretraining's <task>_acc, fine-tuning's official
    # metric (VQA's score, NLVR2's accuracy, VCR's q_a / qa_r, ...)
    accuracies = sorted({k for r in val for k in r
                         if k not in _NOT_ACCURACIES and k not in losses})
    # Constrained layout makes room for the legends beside the axes.
    fig = Figure(figsize=(13, 4.5), layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    for i, name in enumerate(losses):
        color = f"C{i % 10}"
        points = [(r["step"], r[name]) for r in train if name in r]
        if points:  # one logged step (a run shorter than log_every) is a dot, not an empty line
            ax_loss.plot(*zip(*points), color=color, lw=1.5 if name == "loss" else 1, label=name,
                         marker="o" if len(points) == 1 else None, ms=4)
        points = [(r["step"], r[name]) for r in val if name in r]
        if points:
            ax_loss.plot(*zip(*points), "o", color=color, ms=4, label=f"{name} (val)")
    ax_loss.set(xlabel="step", ylabel="loss", title=f"{title}: losses")
    ax_loss.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    for i, name in enumerate(accuracies):
        points = [(r["step"], r[name]) for r in val if name in r]
        ax_acc.plot(*zip(*points), "o-", color=f"C{i % 10}", label=name)
    ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="validation accuracies")
    if accuracies:
        ax_acc.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    return fig
