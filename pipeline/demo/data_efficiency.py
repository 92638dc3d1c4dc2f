"""`pipeline demo data-efficiency`: how much task data pretraining is worth. LXMERT's finding
(Tan & Bansal 2019, and the field's since) is that pretraining matters most when the task has
little data; here it is measured on the main demo's world.

The main demo's steps 1-4 (run into the main demo's --out, `pipeline demo --out demo_out` first,
every finished step is reused), a pretraining, then VQA fine-tuned on 5, 10, 25 and 100% of the
training questions (`data.train_fraction`: nested fixed subsets, the same questions for both
models), from the pretrained LXMERT and from scratch, each scored with the official metric on the
same held-out minival questions. A smaller share trains more epochs (the main demo's vqa_epochs /
share, at most max_epochs), so that no run stops before it has learned what its data can teach.

Which pretraining (`pretraining`):
- "looking" (the default): the pretraining that makes the masked LM read the image
  (docs/results.md, "The diagnosis"): the main demo's five tasks, the masked LM on captions and
  region descriptions only with their colour, shape and material words masked at 50%, matching
  on captions, the corpus's own vocabulary (`pipeline corpus vocab`, both starts read it),
  looking_epochs epochs, and question answering on qa_sources only: other datasets' questions
  (GQA's and Visual Genome's), not VQA's own. LXMERT's pretraining answers VQA's training
  questions too; here that gave the pretrained start the answers a small share withholds, and
  they were the whole gain of the 12-epoch recipe before (docs/demo.md, "Whose answers"). Its
  runs are under runs/looking-qa-gqa-vgqa/ (the sources in the name; runs/looking-noqa/ without
  question answering).
- "main": the main demo's pretraining and its 100% runs, reused (its question answering reads
  VQA's training questions, all of them).
Writes data_efficiency.json and data_efficiency.png (beside the main demo's results.json when
run into its --out).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.config import ConfigError
from pipeline.demo.main_inputs import prepare_demo, score
from pipeline.demo.recipe import (
    DemoConfig,
    finetune_config,
    own_tokenizer,
    pretraining_runs,
    runs_dir,
    seeded_name,
    spread,
)
from pipeline.demo.trainings import Steps, Trainings

CURVE_VARIANTS = ("pretrained", "scratch")


@dataclass(frozen=True)
class DataEfficiencyConfig(DemoConfig):
    """The main demo's settings (world, pretraining, VQA fine-tuning), and: fractions: the shares
    of VQA's training questions fine-tuned on. max_epochs: the most epochs of a small share's run
    (it trains vqa_epochs / share). pretraining: "looking" here by default (DemoConfig: the
    pretraining that reads the image, 62 epochs over captions, descriptions and GQA's and Visual
    Genome's questions; 31 were worth 3 points less at 10% of the questions: docs/demo.md) or
    "main" (the main demo's; module docstring)."""

    fractions: tuple[float, ...] = (0.05, 0.1, 0.25, 1.0)
    max_epochs: int = 64
    pretraining: str = "looking"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "fractions", tuple(float(f) for f in self.fractions))
        if not self.fractions or not all(0 < f <= 1 for f in self.fractions):
            raise ConfigError(f"fractions = {list(self.fractions)}: each must be in (0, 1]")


def run_name(variant: str, fraction: float) -> str:
    """The run directory's name: the main demo's for the whole set (so its runs are reused)."""
    return f"vqa_{variant}" if fraction == 1 else f"vqa_{variant}_{fraction * 100:g}pct"


def epochs_for(cfg: DataEfficiencyConfig, fraction: float) -> int:
    return min(cfg.max_epochs, round(cfg.vqa_epochs / fraction))


def format_curve(results: dict) -> str:
    """Each share's accuracies and the gain, each +- one standard error."""
    lines = ["  share of questions   " + "".join(f"{v:>18}" for v in CURVE_VARIANTS)
             + "             gain"]
    for share, row in results.items():
        lines.append(f"  {share:>18}   "
                     + "".join(f"{row[v]:10.2f} +- {row[v + '_se']:4.2f}" for v in CURVE_VARIANTS)
                     + f"  {row['gain']:+6.2f} +- {row['gain_se']:4.2f}")
    return "\n".join(lines)


def curve_row(scores: dict) -> dict:
    """A share's row of data_efficiency.json from each start's `score` (its metrics and its items'
    accuracies): the accuracies, their standard errors, the gain (pretrained - scratch) and its
    standard error, paired: both starts answer the same questions, so it is that of the mean of
    the questions' differences (error_bars.paired_difference), not sqrt(SE1^2 + SE2^2)."""
    from pipeline.evaluate.error_bars import paired_difference

    row = {}
    for variant in CURVE_VARIANTS:
        row[variant] = scores[variant][0]["accuracy"]
        row[variant + "_se"] = scores[variant][0]["accuracy_se"]
    _, row["gain_se"] = paired_difference(scores["pretrained"][1], scores["scratch"][1])
    row["gain"] = row["pretrained"] - row["scratch"]
    return row


def draw_curve(results: dict, path: Path) -> Path:
    """VQA accuracy against the share of training questions, one line per start, with bars of
    one standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shares = [float(s.rstrip("%")) for s in results]
    fig, ax = plt.subplots(figsize=(6, 4))
    for variant in CURVE_VARIANTS:
        ax.errorbar(shares, [row[variant] for row in results.values()],
                    yerr=[row[variant + "_se"] for row in results.values()], marker="o",
                    capsize=3, label=f"{variant} LXMERT")
    ax.set_xscale("log")
    ax.set_xticks(shares, [f"{s:g}%" for s in shares])
    ax.set_xlabel("share of VQA's training questions")
    ax.set_ylabel("VQA accuracy on held-out minival (%), +- 1 SE")
    ax.set_title("what pretraining is worth, by task data")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run_data_efficiency(cfg: DataEfficiencyConfig, out: Path, seeds: int = 1) -> dict:
    """The experiment (module docstring) under `out`, with train_seed cfg.train_seed (its runs
    under runs/ for seed 0, runs_seed<k>/ for another; data_efficiency.json, or
    data_efficiency_seed<k>.json); with `seeds` > 1 again with the next seeds, and each share's
    gain over the seeds (data_efficiency_seeds.json). Returns the first seed's {share:
    curve_row}."""
    step = Steps(4 + int(cfg.pretraining == "looking") + 3 * seeds)
    prepared = prepare_demo(cfg, out, step)
    tokenizer = own_tokenizer(cfg, prepared.corpus, out, step)
    every = []
    for seed in range(cfg.train_seed, cfg.train_seed + seeds):
        results = _curve(dataclasses.replace(cfg, train_seed=seed), prepared, tokenizer,
                         runs_dir(out, seed), step)
        (out / seeded_name("data_efficiency.json", seed)).write_text(
            json.dumps(results, indent=2) + "\n")
        print(format_curve(results))
        every.append(results)
    picture = draw_curve(every[0], out / seeded_name("data_efficiency.png", cfg.train_seed))
    if seeds > 1:
        gains = {share: spread([r[share]["gain"] for r in every]) for share in every[0]}
        (out / "data_efficiency_seeds.json").write_text(
            json.dumps({"seeds": every, "gain": gains}, indent=2) + "\n")
        print(f"\ngain over {seeds} seeds: mean +- standard deviation [range]")
        for share, g in gains.items():
            print(f"  {share:>6}  {g['mean']:+6.2f} +- {g['std']:4.2f}  "
                  f"[{g['min']:+.2f}, {g['max']:+.2f}]")
    print(f"\n{out / seeded_name('data_efficiency.json', cfg.train_seed)}, {picture}")
    return every[0]


def _curve(cfg: DataEfficiencyConfig, prepared, tokenizer: str, runs_root: Path,
           step: Steps) -> dict:
    """One seed's pretraining, fine-tunings and scores under `runs_root`: {share: curve_row}."""
    from pipeline.finetune.job import finetune_job
    from pipeline.pretrain.job import pretrain_job

    seed = f" (seed {cfg.train_seed})" if cfg.train_seed else ""
    pretraining, where = pretraining_runs(cfg, runs_root, prepared.corpus, prepared.coco,
                                          tokenizer)
    pretrain_run = where / "pretrain"
    runs = {(v, f): where / run_name(v, f) for f in cfg.fractions for v in CURVE_VARIANTS}

    def finetune(variant: str, fraction: float) -> None:
        config = finetune_config("vqa", cfg, variant, pretraining, pretrain_run,
                                 prepared.world, prepared.corpus, prepared.coco, tokenizer)
        config = dataclasses.replace(
            config, data=dataclasses.replace(config.data, train_fraction=fraction),
            run=dataclasses.replace(config.run, epochs=epochs_for(cfg, fraction)))
        trainings.submit(f"vqa {variant} {fraction * 100:g}%", finetune_job, config,
                         runs[variant, fraction])

    with Trainings(cfg.parallel) as trainings:
        step(f"pretrain a small LXMERT; meanwhile fine-tune VQA from scratch on each share{seed}")
        trainings.submit("pretrain", pretrain_job, pretraining, pretrain_run)
        for fraction in cfg.fractions:
            finetune("scratch", fraction)
        trainings.wait("pretrain")
        step(f"fine-tune VQA from the pretrained model on each share{seed}")
        for fraction in cfg.fractions:
            finetune("pretrained", fraction)
        trainings.wait()
    step(f"score the held-out minival questions{seed}")
    return {
        f"{fraction * 100:g}%": curve_row({
            v: score("vqa", runs[v, fraction], prepared.world, prepared.corpus)
            for v in CURVE_VARIANTS
        })
        for fraction in sorted(cfg.fractions)
    }
