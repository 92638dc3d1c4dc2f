"""`pipeline pretrain`: a cross-modal transformer pretrained on feature shards + a corpus."""

from __future__ import annotations

import argparse

from pipeline.common.arguments import checked_out_dir
from pipeline.common.config import ConfigError
from pipeline.train.arguments import (
    add_training_args,
    run_config_path,
    run_sets,
    train,
    with_workers,
)

HELP = "pretrain LXMERT / VisualBERT / VL-BERT / ViLBERT on shards + corpus"
ON_INTERRUPT = ("run the same command with --resume to continue from the last checkpoint "
                "(from step 0 if none was written yet)")
DESCRIPTION = """\
Pretrain a cross-modal transformer on feature shards joined with a corpus
(`pipeline corpus build`). The config names the architecture (lxmert, visualbert, vlbert,
vilbert), its model and objective settings, the data, the optimizer and the run; shipped:
configs/pretrain/<arch>.yaml (paper scale) and <arch>_tiny.yaml (a laptop).

The run directory (--out) receives config.yaml (resolved), metrics.jsonl (one JSON line per
logged step and per validation), tensorboard/, checkpoints/step_N/ (full state, and model/ in our
checkpoint format: `pipeline convert DIR/checkpoints/step_N/model --to hf`) and loss_curves.png.
`--resume` continues from the latest checkpoint: the following steps repeat exactly what an
uninterrupted run with the same seed would have done. SIGTERM (a scheduler's) or Ctrl-C: the step
in flight finishes, its checkpoint is written, exit 143 (130); `--resume auto` resumes a run that
exists and starts one that does not, so a scheduler can restart the same command; a lost Ray
Train worker restarts from the latest checkpoint by itself (run.max_failures; docs/reliability.md).

Speed: run.data_workers (batches built ahead in processes; on a GPU half the cores per GPU, 2 to
8), run.shapes (static on a GPU), run.precision (bf16 weights with float32 master weights on a
GPU), run.cuda_graph (the whole step replayed as one CUDA graph), run.compile (each transformer
layer). End to end, as VL-BERT: `--set visual.trainable=true
--set visual.weights=DETECTOR --set visual.extract_config=EXTRACT.yaml` trains the detector's
trunk (res3-res5) with the transformer on the shards' images (extracted with
output.keep_images=true); each checkpoint then holds detector.safetensors for `pipeline extract`.

Examples:
  pipeline pretrain --config configs/pretrain/lxmert_tiny.yaml --out runs/lxmert \\
      --set data.corpus=corpus --set data.shards=[feats/coco,feats/vg]
  pipeline pretrain --out runs/lxmert --resume      (the run's own config.yaml)
  pipeline pretrain --config configs/pretrain/lxmert.yaml --workers 8 --set run.device=cuda ...
  pipeline pretrain --config configs/pretrain/lxmert.yaml --show-config   every key and meaning
"""


def add_args(parser: argparse.ArgumentParser) -> None:
    add_training_args(parser, "run.epochs=2")


def config(args: argparse.Namespace):
    """The run's config: --config (with --resume, the run's config.yaml), --set, --workers."""
    from pipeline.pretrain.config import load_config

    return load_config(run_config_path(args, "pretrain"), run_sets(args))


def run(args: argparse.Namespace) -> int:
    from pipeline.pretrain.job import prepare_pretrain, pretrain_job

    cfg = with_workers(config(args), args.address)
    if not cfg.data.corpus or not cfg.data.shards:
        raise ConfigError("set data.corpus (a `pipeline corpus build` directory) and data.shards")
    with checked_out_dir(args.out):  # refused (bad data, say): no empty --out left behind
        train(pretrain_job, prepare_pretrain(cfg), args)
    print(f"run directory: {args.out} (metrics.jsonl, loss_curves.png, checkpoints/)")
    return 0
