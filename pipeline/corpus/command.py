"""`pipeline corpus build`: the pretraining corpus from the official annotation files
(pipeline/corpus/build.py does the work)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from pipeline.common.arguments import Actions
from pipeline.common.config import resolve

HELP = "build the pretraining corpus from annotation files"
ON_INTERRUPT = "nothing was written; run the same command again"
DESCRIPTION = "Build LXMERT's pretraining corpus (splits, answer table, text) from annotation files."


BUILD_HELP = "COCO / VG / VQA / GQA / CC3M annotations -> LXMERT-style corpus splits and answers"
BUILD_DESCRIPTION = (
    "Read the official annotation files named by the config, split them the LXMERT way (train, "
    "nominival, minival held out, vgnococo, cc3m), build the answer table from the training "
    "splits, write {split}.jsonl, answers.json, text.txt, stats.json and corpus.yaml into --out, "
    "and print the statistics table."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    build = Actions(parser, "corpus_verb").add("build", BUILD_HELP, BUILD_DESCRIPTION,
                                                  example="minival_images=4")
    build.add_argument("--out", required=True, metavar="DIR", help="corpus directory")
    build.add_argument("--root", metavar="DIR", help="folder the config's relative paths are "
                       "read against (replaces the config's root)")
    build.add_argument("--overwrite", action="store_true",
                       help="replace the corpus that --out holds already")


def config(args: argparse.Namespace):
    """The corpus config: --config, --set, then --root."""
    from pipeline.corpus.config import CorpusConfig

    cfg = resolve(CorpusConfig(), args.config, args.sets)
    return cfg if args.root is None else replace(cfg, root=args.root)


def run(args: argparse.Namespace) -> int:
    from pipeline.corpus.build import build_corpus
    from pipeline.corpus.stats import format_table

    stats = build_corpus(config(args), Path(args.out), overwrite=args.overwrite)
    print(format_table(stats))
    print(f"corpus written to {args.out}")
    return 0
