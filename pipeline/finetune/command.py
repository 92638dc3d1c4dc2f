"""`pipeline finetune`: VQA v2, GQA, NLVR2, VCR, RefCOCO+ or Flickr30K retrieval fine-tuned from a
checkpoint (or from scratch)."""

from __future__ import annotations

import argparse

from pipeline.common.arguments import checked_out_dir
from pipeline.common.config import ConfigError
from pipeline.finetune.examples import TASKS
from pipeline.train.arguments import (
    add_training_args,
    run_config_path,
    run_sets,
    train,
    with_workers,
)

HELP = "fine-tune on VQA, GQA, NLVR2, VCR, RefCOCO+ or Flickr30K from a checkpoint (or scratch)"
ON_INTERRUPT = ("run the same command with --resume to continue from the last checkpoint "
                "(from step 0 if none was written yet)")
DESCRIPTION = """\
Fine-tune on VQA v2, GQA, NLVR2, VCR, RefCOCO+ or Flickr30K retrieval from the released files
(data.root: see the README's folder layouts), starting from a checkpoint (--from:
ours, e.g. RUN/checkpoints/step_N/model of `pipeline pretrain`; a Hugging Face directory; or a
file the architecture's authors released, e.g. LXMERT's *_LXRT.pth, with their config file in
`--set init_config=FILE` where the weights do not record every size: the README's "Released
weights") or from scratch. Defaults are LXMERT's: batch 32, 4 epochs, 10%
warmup, lr 5e-5 (VQA, NLVR2) / 1e-5 (GQA), BCE on soft scores for VQA and GQA. From an LXMERT
pretraining checkpoint with a QA head, `--set init_answers=CORPUS` (or all_ans.json) starts the
answer head from the pretrained rows. The same trainer as pretraining: --workers N on Ray Train,
--resume (`--resume auto`: resume a run that exists, else start it), SIGTERM's checkpoint and exit
143, metrics.jsonl, checkpoints/. The run directory also receives answers.json (VQA, GQA).
VCR, RefCOCO+ and Flickr30K take ViLBERT's recipes: 4-way multiple choice (Q->A and QA->R) for
VCR, a score per region trained on its IoU with the referred box for RefCOCO+, 4-way multiple
choice with a random caption, a random image and a hard negative for Flickr30K. VQA and GQA can
train the detector end to end: `--set visual.trainable=true --set visual.weights=DETECTOR` (see
`pipeline pretrain --help`); from VL-BERT's `vl-bert-*-e2e.model` the CNN the file carries trains
(visual.weights may stay empty; VL-BERT's pooler: `--set visual.pooler=roi_align`).

Examples:
  pipeline finetune vqa --from runs/lxmert --out runs/vqa \\
      --set data.root=DATA/vqa --set data.train=[train2014] --set data.val=val2014 \\
      --set data.holdout=CORPUS --set data.shards=[feats/coco]
  pipeline finetune nlvr2 --from model_LXRT.pth --out runs/nlvr2 --set data.root=DATA/nlvr2 \\
      --set data.train=[train] --set data.val=dev --set data.shards=[feats/nlvr2]
  pipeline finetune vcr --from runs/lxmert --out runs/vcr --set data.root=DATA/vcr \\
      --set data.train=[train] --set data.val=val --set data.shards=[feats/vcr]
  pipeline finetune vqa --show-config          every key with its value and meaning
"""



def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task", choices=TASKS)
    parser.add_argument("--from", dest="init", metavar="CKPT",
                        help="checkpoint the encoder starts from: a pretraining run directory "
                        "(its latest checkpoint), a checkpoint's model/ directory, a Hugging Face "
                        "directory or an official *_LXRT.pth (default: the config's init; none = "
                        "from scratch)")
    add_training_args(parser, "optim.lr=1e-3")


def config(args: argparse.Namespace):
    """The run's config: the task's defaults, --config (with --resume, the run's config.yaml),
    --set, --workers and --from; not yet checked across fields."""
    from pipeline.finetune.config import load_config

    sets = run_sets(args)
    if args.init is not None:
        sets.append(f"init={args.init}")
    return load_config(args.task, run_config_path(args, "finetune"), sets, checked=False)


def run(args: argparse.Namespace) -> int:
    from pipeline.finetune.job import finetune_job, prepare_finetune

    cfg = with_workers(config(args).check(), args.address)
    if not cfg.data.root or not cfg.data.shards:
        raise ConfigError("set data.root (the task's released files) and data.shards")
    with checked_out_dir(args.out):  # refused (bad data, say): no empty --out left behind
        train(finetune_job, prepare_finetune(cfg), args)
    out = args.out
    print(f"run directory: {out}; submission files: pipeline predict {args.task} --run {out} ...")
    return 0
