"""`pipeline convert`: move a model checkpoint between our format, Hugging Face's and the files the
architectures' authors released (model/checkpoints does the work; this is the command line around
it)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ARCHS = ("lxmert", "visualbert", "vlbert", "vilbert")
FORMATS = ("ours", "hf", "official")

HELP = "convert a model checkpoint between our, Hugging Face and the authors' released formats"
DESCRIPTION = """\
Convert a model checkpoint from any of three formats into another, strictly: a tensor missing,
unexpected or of the wrong shape is an error that names it.

Formats (SRC's is detected; --to chooses DST's):
  ours      a directory: config.json ({"arch", "model", "config": our config}) + model.safetensors;
            all four architectures, encoders and models with heads
  hf        a Hugging Face directory: config.json + model.safetensors (or pytorch_model.bin);
            lxmert (LxmertForPreTraining, or LxmertModel for an encoder alone) and visualbert
            (VisualBertModel, VisualBertForPreTraining and the four task models); written so
            that transformers' from_pretrained loads it
  official  a file as the architecture's authors released it, its architecture read off its
            tensor names: LXMERT's *_LXRT.pth; ViLBERT's pretrained_model.bin,
            multi_task_model.bin (12-in-1) and vilbert_beta's pytorch_model_8.bin; VL-BERT's
            .model files (pretraining, VQA, VCR, RefCOCO+); VisualBERT's .th (COCO pretraining,
            VQA, NLVR2, VCR). Heads are kept (--drop-heads: the encoder alone). Read with
            torch.load(weights_only=True): tensors only, never pickled code. What the weights do
            not record (ViLBERT's co-attention schedule, head counts) is the authors' released
            default, said in a note, or their config file's (--config: their JSON or yaml).

Examples:
  pipeline convert model_LXRT.pth --to hf --out lxmert-hf
  pipeline convert multi_task_model.bin --to ours --out vilbert-12in1
  pipeline convert vl-bert-base-e2e.model --to ours --out vlbert --config base_e2e_16x16G_fp16.yaml
  pipeline convert vilbert-12in1 --to official --out again.bin
  pipeline convert lxmert-hf --to ours --out lxmert-ours
"""


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "src", metavar="SRC", help="checkpoint: a directory (ours, hf) or a released file "
        "(.pth, .bin, .model, .th, ...)"
    )
    parser.add_argument("--to", required=True, choices=FORMATS, help="format to write")
    parser.add_argument(
        "--out",
        required=True,
        metavar="DST",
        help="directory (ours, hf) or file (official) to write; must not exist yet",
    )
    parser.add_argument(
        "--arch",
        choices=ARCHS,
        help="the architecture SRC must hold (default: whatever is detected)",
    )
    parser.add_argument(
        "--drop-heads",
        action="store_true",
        help="keep the backbone only (a Hugging Face task model's, or LXMERT's encoder)",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="the authors' config file (their JSON or yaml) for an official SRC whose weights do "
        "not record every size (default: their released model's, said in a note)",
    )
    parser.add_argument(
        "--num-heads",
        type=int,
        metavar="N",
        help="attention heads of an official LXMERT file, which does not record them "
        "(default: hidden size / 64, i.e. 12 for LXMERT)",
    )


def run(args: argparse.Namespace) -> int:
    from model.checkpoints import (
        CheckpointError,
        load_checkpoint,
        save_hf,
        save_official,
        save_ours,
    )

    out = Path(args.out)
    if out.exists():
        print(f"pipeline convert: {out} exists; remove it or choose another --out", file=sys.stderr)
        return 2
    writers = {"ours": save_ours, "hf": save_hf, "official": save_official}
    try:
        checkpoint = load_checkpoint(
            args.src,
            args.arch,
            drop_heads=args.drop_heads,
            num_heads=args.num_heads,
            config_file=args.config,
        )
        writers[args.to](out, checkpoint.arch, checkpoint.config, checkpoint.state_dict)
    except CheckpointError as err:
        print(f"pipeline convert: {err}", file=sys.stderr)
        return 2
    report = checkpoint.report
    heads = ", ".join(report.heads) or "none"
    print(
        f"converted {report.source} -> {out}\n"
        f"  arch {report.arch}, format {report.format} -> {args.to}, model {report.model}, "
        f"{report.tensors} tensors, heads: {heads}"
    )
    for note in report.notes:
        print(f"  note: {note}")
    config = checkpoint.config  # LXMERT's official readers assume hidden / 64 heads
    if (args.to, checkpoint.arch) == ("official", "lxmert") and (
        config.num_heads * 64 != config.hidden_size
    ):
        print(f"  note: official files do not record the attention heads, and readers assume "
              f"hidden / 64 ({config.hidden_size} / 64); this model has {config.num_heads}: read "
              f"{out} back with --num-heads {config.num_heads}")
    return 0
