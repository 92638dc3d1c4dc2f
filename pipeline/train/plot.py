"""`pipeline plot RUN_DIR`: a run's loss curves and accuracies in one PNG, from metrics.jsonl."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.train.logs import read_metrics

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
    print(plot_run(args.run, args.out))
    return 0


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Left: the total and per-task training losses (lines) and validation losses (dots) by step.
    Right: validation accuracies by step. Written to `out` (default RUN_DIR/loss_curves.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    train = [r for r in records if r.get("split", "train") == "train"]
    val = [r for r in records if r.get("split") == "val"]
    if not train and not val:
        raise ValueError(f"{run_dir / 'metrics.jsonl'}: no records to plot")
    losses = sorted({k for r in records for k in r if k == "loss" or k.startswith("loss_")})
    accuracies = sorted({k for r in val for k in r if k.endswith("_acc")})
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(12, 4.5))
    for i, name in enumerate(losses):
        color = f"C{i % 10}"
        points = [(r["step"], r[name]) for r in train if name in r]
        if points:
            ax_loss.plot(*zip(*points), color=color, lw=1.5 if name == "loss" else 1, label=name)
        points = [(r["step"], r[name]) for r in val if name in r]
        if points:
            ax_loss.plot(*zip(*points), "o", color=color, ms=4, label=f"{name} (val)")
    ax_loss.set(xlabel="step", ylabel="loss", title=f"{run_dir.name}: losses")
    ax_loss.legend(fontsize=7, ncol=2)
    for i, name in enumerate(accuracies):
        points = [(r["step"], r[name]) for r in val if name in r]
        ax_acc.plot(*zip(*points), "o-", color=f"C{i % 10}", label=name)
    ax_acc.set(xlabel="step", ylabel="accuracy", ylim=(0, 1), title="validation accuracies")
    if accuracies:
        ax_acc.legend(fontsize=8)
    fig.tight_layout()
    target = Path(out) if out is not None else run_dir / PLOT_NAME
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
