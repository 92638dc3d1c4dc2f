"""`pipeline shards verify | import-tsv | export-tsv | import-vinvl-tsv | export-vinvl-tsv`: check
shard sets, and move features between shards and LXMERT-style TSV files or the TSVs OSCAR / VinVL
read (shards/verify.py, shards/tsv.py, shards/vinvl_tsv.py do the work)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipeline.common.arguments import Actions
from pipeline.common.config import ConfigError, resolve
from shards.storage import as_path

HELP = "inspect, verify and convert feature shards"
DESCRIPTION = "Check a shard set, or convert features between shards and LXMERT-style TSV files."


@dataclass(frozen=True)
class ImportConfig:
    """shard_size: rows per shard. features_dtype: float32 is lossless, float16 halves the size.
    box_mode / preset: how the TSV was made (LXMERT's files: fixed 36 boxes, the lxmert preset)."""

    shard_size: int = 5000
    features_dtype: Literal["float32", "float16"] = "float32"
    box_mode: Literal["adaptive", "fixed", "given"] = "fixed"
    preset: str = "lxmert"


def add_args(parser: argparse.ArgumentParser) -> None:
    actions = Actions(parser, "shards_verb")
    verify = actions.add(
        "verify", "check schema, checksums, counts, NaN/inf and box bounds",
        "Check every shard of a shard set; print every problem with its shard and key; exit 1 if "
        "there is any.",
    )
    verify.add_argument("dir", help="shard directory")
    imp = actions.add(
        "import-tsv", "convert an LXMERT/bottom-up-attention TSV feature file into shards",
        "Stream an LXMERT-style TSV (img_id, img_h, img_w, objects_id, objects_conf, attrs_id, "
        "attrs_conf, num_boxes, boxes, features) into schema-v1 shards.",
        example="features_dtype=float16",
    )
    imp.add_argument("tsv", help="TSV feature file")
    imp.add_argument("--out", required=True, help="output shard directory")
    imp.add_argument("--dataset", required=True, help="dataset name recorded in the keys, e.g. coco")
    imp.add_argument("--split", default="", help="split recorded in the metadata")
    exp = actions.add(
        "export-tsv", "write shards back as an LXMERT-style TSV",
        "Write every sample of a shard set as one LXMERT-style TSV row.",
    )
    exp.add_argument("dir", help="shard directory")
    exp.add_argument("--out", required=True, help="output TSV file")
    vexp = actions.add(
        "export-vinvl-tsv", "write shards as the feature, label and hw TSVs OSCAR / VinVL read",
        "Write every sample of a shard set as OSCAR's feature TSV (2048 + 6 box values a row), "
        "label TSV (rect, class, conf, attributes) and hw TSV: PREFIX.feature.tsv, "
        "PREFIX.label.tsv, PREFIX.hw.tsv (shards/vinvl_tsv.py).",
    )
    vexp.add_argument("dir", help="shard directory")
    vexp.add_argument("--out", required=True, metavar="PREFIX", help="output path prefix")
    vexp.add_argument("--labelmap", required=True, metavar="FILE",
                      help="the label map naming the ids: VG-SGG-dicts-vgoi6-clipped.json")
    vimp = actions.add(
        "import-vinvl-tsv", "convert OSCAR / VinVL feature, label and hw TSVs into shards",
        "Read PREFIX.feature.tsv, PREFIX.label.tsv and PREFIX.hw.tsv (as export-vinvl-tsv "
        "writes them) into schema-v1 shards, losslessly.",
    )
    vimp.add_argument("prefix", help="path prefix of the three TSVs")
    vimp.add_argument("--out", required=True, help="output shard directory")
    vimp.add_argument("--labelmap", required=True, metavar="FILE",
                      help="the label map naming the ids: VG-SGG-dicts-vgoi6-clipped.json")
    vimp.add_argument("--dataset", required=True, help="dataset name recorded in the keys")
    vimp.add_argument("--split", default="", help="split recorded in the metadata")


def config(args: argparse.Namespace) -> ImportConfig:
    """import-tsv's settings (the other actions have none)."""
    return resolve(ImportConfig(), args.config, args.sets)


def run(args: argparse.Namespace) -> int:
    return {"verify": _verify, "import-tsv": _import, "export-tsv": _export,
            "export-vinvl-tsv": _export_vinvl, "import-vinvl-tsv": _import_vinvl,
            }[args.shards_verb](args)


def _verify(args: argparse.Namespace) -> int:
    from shards.verify import verify_report

    directory = as_path(args.dir)
    if not directory.is_dir():
        raise ConfigError(f"{args.dir} is not a directory")
    report = verify_report(directory)
    for problem in report.problems:  # DIR/SHARD.tar/KEY: message, or DIR: message
        print(f"{directory}/{problem}" if problem.shard else f"{directory}: {problem.message}")
    print(f"{directory}: checked {_count(report.shards, 'shard')}, "
          f"{_count(report.samples, 'sample')}: {_count(len(report.problems), 'problem')}")
    return 1 if report.problems else 0


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _import(args: argparse.Namespace) -> int:
    from shards.tsv import import_tsv

    cfg = config(args)
    if not Path(args.tsv).is_file():
        raise ConfigError(f"TSV file {args.tsv} does not exist")
    result = import_tsv(
        args.tsv, args.out, dataset=args.dataset, split=args.split,
        shard_size=cfg.shard_size, features_dtype=cfg.features_dtype,
        box_mode=cfg.box_mode, preset=cfg.preset,
    )
    print(
        f"{args.tsv} -> {args.out}: {result.rows} rows, {result.written} samples written, "
        f"{result.failed} failed, {result.skipped} already done, {len(result.shards)} shard(s)"
    )
    return 1 if result.failed else 0


def _labelmap(path: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from extractor.labels import labelmap_names

    try:
        return labelmap_names(path)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def _export_vinvl(args: argparse.Namespace) -> int:
    from shards.vinvl_tsv import export_vinvl_tsv

    count = export_vinvl_tsv(args.dir, args.out, *_labelmap(args.labelmap))
    print(f"{args.dir} -> {args.out}.{{feature,label,hw}}.tsv: {count} rows")
    return 0


def _import_vinvl(args: argparse.Namespace) -> int:
    from shards.vinvl_tsv import import_vinvl_tsv

    result = import_vinvl_tsv(args.prefix, args.out, *_labelmap(args.labelmap),
                              dataset=args.dataset, split=args.split)
    print(
        f"{args.prefix} -> {args.out}: {result.rows} rows, {result.written} samples written, "
        f"{result.failed} failed, {result.skipped} already done, {len(result.shards)} shard(s)"
    )
    return 1 if result.failed else 0


def _export(args: argparse.Namespace) -> int:
    from shards.tsv import export_tsv

    count = export_tsv(args.dir, args.out)
    print(f"{args.dir} -> {args.out}: {count} rows")
    return 0
