"""`pipeline analyze cross-modal` end to end: read the files, run both tests (cross_modal.py),
write report.json and cross_modal.png, print the summary.

report.json: for each test ("masked_lm", "masked_regions"; the latter null without a region head)
and each word class present (word_classes.py) plus "all": count, accuracy and mean loss per
condition ("all", "aligned_removed", "none"), and the deltas: all - aligned_removed and all -
none, in accuracy points and in loss (loss deltas are negative when removing hurts).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.analyze.cross_modal import (
    CONDITIONS, PROBES, Counts, Influence, cross_modal_influence,
)
from pipeline.analyze.entities import read_entities
from pipeline.analyze.model import AnalysisInputs
from pipeline.analyze.word_classes import CLASSES
from pipeline.common.devices import pick_device
from pipeline.finetune.data import Features

# What each condition removes, per test (the report's and the picture's words).
REMOVED = {
    "masked_lm": {"all": "every region", "aligned_removed": "phrase's regions removed",
                  "none": "no region"},
    "masked_regions": {"all": "whole caption", "aligned_removed": "phrase removed",
                       "none": "no text"},
}


def _entry(by_condition: dict[str, Counts]) -> dict:
    count = by_condition["all"].count
    accuracy = {c: round(100.0 * n.correct / n.count, 2) if n.count else 0.0
                for c, n in by_condition.items()}
    loss = {c: round(n.loss / n.count, 4) if n.count else 0.0 for c, n in by_condition.items()}
    return {
        "count": count, "accuracy": accuracy, "loss": loss,
        "delta_accuracy": {c: round(accuracy["all"] - accuracy[c], 2) for c in CONDITIONS[1:]},
        "delta_loss": {c: round(loss["all"] - loss[c], 4) for c in CONDITIONS[1:]},
    }


def probe_report(influence: Influence, probe: str) -> dict | None:
    """One test's entries by word class (in CLASSES order) and "all"; None when not run."""
    counts = influence.tally.counts
    if probe == "masked_regions" and not influence.tally.regions:
        return None
    report, total = {}, {c: Counts() for c in CONDITIONS}
    for word_class in CLASSES:
        here = {c: counts.get((probe, word_class, c)) for c in CONDITIONS}
        if here["all"] is None:
            continue
        report[word_class] = _entry(here)
        for c, n in here.items():
            total[c].count += n.count
            total[c].correct += n.correct
            total[c].loss += n.loss
    report["all"] = _entry(total)
    return report


def cross_modal_report(influence: Influence, meta: dict) -> dict:
    return {**meta, "captions": influence.captions, "images": influence.images,
            **{probe: probe_report(influence, probe) for probe in PROBES},
            "skipped": dict(sorted(influence.skipped.counts.items()))}


def summary(report: dict) -> str:
    lines = [f"{report['arch']}{' (random init)' if report['random_init'] else ''}: "
             f"{report['captions']} captions of {report['images']} images"]
    for probe in PROBES:
        entries = report[probe]
        if entries is None:
            lines.append(f"{probe}: no region head ({report['arch']})")
            continue
        names = REMOVED[probe]
        lines.append(f"{probe} accuracy (%): {names['all']} / {names['aligned_removed']} / "
                     f"{names['none']}")
        for word_class, entry in entries.items():
            a = entry["accuracy"]
            lines.append(f"  {word_class:<9}{entry['count']:6d}   {a['all']:6.2f} "
                         f"{a['aligned_removed']:7.2f} {a['none']:7.2f}   delta "
                         f"{entry['delta_accuracy']['aligned_removed']:+6.2f} "
                         f"{entry['delta_accuracy']['none']:+6.2f}")
    for reason, n in report["skipped"].items():
        lines.append(f"skipped: {n} {reason}")
    return "\n".join(lines)


def draw(report: dict, path: Path) -> Path:
    """cross_modal.png: per test, each word class's accuracy in the three conditions."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    probes = [p for p in PROBES if report[p] is not None]
    fig, axes = plt.subplots(1, len(probes), figsize=(7 * len(probes), 4.6), squeeze=False)
    for ax, probe in zip(axes[0], probes):
        entries = report[probe]
        names = list(entries)
        x = np.arange(len(names))
        for i, condition in enumerate(CONDITIONS):
            ax.bar(x + (i - 1) * 0.27, [entries[n]["accuracy"][condition] for n in names], 0.27,
                   label=REMOVED[probe][condition])
        ax.set_xticks(x, [f"{n}\n({entries[n]['count']})" for n in names], fontsize=8)
        ax.set_ylabel("accuracy (%)")
        ax.set_ylim(0, 100)
        ax.set_title("masked words" if probe == "masked_lm" else "masked regions' object labels")
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=8)
    title = f"{report['arch']}{' (random init)' if report['random_init'] else ''}"
    fig.suptitle(f"cross-modal influence: {title}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def analyze_cross_modal(inputs: AnalysisInputs, out: Path) -> dict:
    """Writes out/report.json and out/cross_modal.png; returns the report."""
    model = inputs.model(heads=True)
    problems: list = []
    data = read_entities(inputs.entities, inputs.split, problems)
    influence = cross_modal_influence(model, data, Features.open(inputs.shards),
                                      batch_size=inputs.batch_size,
                                      device=pick_device(inputs.device))
    if problems:
        influence.skipped.add("malformed caption lines", len(problems))
    meta = inputs.meta(model)
    report = cross_modal_report(influence, meta)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    picture = draw(report, out / "cross_modal.png")
    print(summary(report))
    print(f"wrote {out / 'report.json'} and {picture}")
    return report
