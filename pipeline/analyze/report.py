"""The analysis as JSON (report.json) and as the lines the command prints.

Accuracies are percentages over a group's cases. Per head: accuracy and image_share (the mean
share of the head's attention from the cases' words that goes to the real regions, padding
excluded), both [layer][head]; active: image_share > 20% (Li et al. §3). best: the most
accurate head (the first in layer-then-head order on ties); best_active: the same among active
heads (Li et al.'s Table 2 considers only those); best_per_layer: each layer's most accurate
head. Relations are listed most frequent first.
"""

from __future__ import annotations

import numpy as np

from pipeline.analyze.cases import ENTITY
from pipeline.analyze.grounding import ACTIVE_SHARE, GroupTally
from pipeline.analyze.run import Analysis


def _percent(count: int | np.ndarray, total: int):
    return 100.0 * count / total if total else 0.0


def _head(layers: tuple[str, ...], accuracy: np.ndarray, at: int, active: np.ndarray) -> dict:
    layer, head = divmod(at, accuracy.shape[1])
    return {"layer": layers[layer], "head": head + 1,
            "accuracy": round(float(accuracy[layer, head]), 2),
            "active": bool(active[layer, head])}


def group_report(layers: tuple[str, ...], group: GroupTally) -> dict:
    accuracy = _percent(group.correct, group.count)
    share = group.image_share / group.count if group.count else group.image_share
    active = share > ACTIVE_SHARE
    flat = np.asarray(accuracy, dtype=np.float64).reshape(-1)
    best_active = (_head(layers, accuracy, int(np.argmax(np.where(active.reshape(-1), flat,
                                                                    -1.0))), active)
                   if active.any() else None)
    return {
        "count": group.count,
        "baseline": round(_percent(group.baseline, group.count), 2),
        "any_region": round(_percent(group.any_region, group.count), 2),
        "best": _head(layers, accuracy, int(np.argmax(flat)), active),
        "best_active": best_active,
        "best_per_layer": [
            _head(layers, accuracy, i * accuracy.shape[1] + int(np.argmax(accuracy[i])), active)
            for i in range(len(layers))],
        "accuracy": np.round(accuracy, 2).tolist(),
        "image_share": np.round(share, 4).tolist(),
        "active": active.tolist(),
    }


def grounding_report(analysis: Analysis, meta: dict) -> dict:
    """meta: what was analysed (model, data): written as given."""
    tally = analysis.tally
    relations = sorted((name for name in tally.groups if name != ENTITY),
                       key=lambda name: (-tally.groups[name].count, name))
    return {
        **meta,
        "layers": list(tally.layers),
        "heads": tally.heads,
        "captions": analysis.captions,
        "images": analysis.images,
        "skipped": dict(sorted(analysis.skipped.counts.items())),
        "entity": group_report(tally.layers, tally.group(ENTITY)),
        "syntactic": {name: group_report(tally.layers, tally.groups[name])
                      for name in relations},
    }


def summary(report: dict, top_relations: int = 10) -> str:
    """What the command prints: the entity result, per layer, and the common relations."""
    entity = report["entity"]
    best = entity["best"]
    lines = [
        f"{report['captions']} captions of {report['images']} images; "
        f"{entity['count']} entities with a box",
        f"entity grounding: best head {best['layer']}-{best['head']} {best['accuracy']:.2f}% "
        f"(baseline, most confident region: {entity['baseline']:.2f}%; "
        f"some region right: {entity['any_region']:.2f}%)",
        "best head per layer: " + ", ".join(
            f"{h['layer']}:{h['accuracy']:.1f}" for h in entity["best_per_layer"]),
    ]
    for reason, n in report["skipped"].items():
        lines.append(f"skipped: {n} {reason}")
    if report["syntactic"]:
        lines.append("syntactic grounding (best active head / baseline, cases):")
    for name, group in list(report["syntactic"].items())[:top_relations]:
        head = group["best_active"] or group["best"]
        lines.append(f"  {name:<12} {head['layer']}-{head['head']} {head['accuracy']:6.2f}%  "
                     f"{group['baseline']:6.2f}%  {group['count']}")
    return "\n".join(lines)
