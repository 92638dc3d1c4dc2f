"""`pipeline corpus build`: the pretraining corpus from the official annotation files
(pipeline/corpus/build.py does the work); `pipeline corpus vocab`: a built corpus's own
vocabulary as a tokenizer directory (pipeline/corpus/vocab.py)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from pipeline.common.arguments import Actions, writable_dir
from pipeline.common.config import resolve

HELP = "build the pretraining corpus from annotation files, or its own vocabulary"
ON_INTERRUPT = "nothing was written; run the same command again"
DESCRIPTION = (
    "Build LXMERT's pretraining corpus (splits, answer table, text) from annotation files, or a "
    "tokenizer of a built corpus's own words."
)


BUILD_HELP = "COCO / VG / VQA / GQA / CC3M annotations -> LXMERT-style corpus splits and answers"
BUILD_DESCRIPTION = (
    "Read the official annotation files named by the config, split them the LXMERT way (train, "
    "nominival, minival held out, vgnococo, cc3m), build the answer table from the training "
    "splits, write {split}.jsonl, answers.json, text.txt, stats.json and corpus.yaml into --out, "
    "and print the statistics table."
)

VOCAB_HELP = "a built corpus's own words -> a tokenizer directory (data.tokenizer)"
VOCAB_DESCRIPTION = (
    "Collect every word of a built corpus's sentences and answers (split as BERT's uncased "
    "tokenizer splits them), write a BERT tokenizer of those words into --out, and print how many "
    "there are and how much of the held-out split they cover. Pretrain and fine-tune with "
    "--set data.tokenizer=OUT: a small model then scores the corpus's words instead of BERT's "
    "30,522 (the demo's corpus: 122 words; docs/results.md). A model trained with it needs "
    "it from then on; a BERT checkpoint (run.init_text) needs BERT's own vocabulary."
)


def add_args(parser: argparse.ArgumentParser) -> None:
    actions = Actions(parser, "corpus_verb")
    build = actions.add("build", BUILD_HELP, BUILD_DESCRIPTION, example="minival_images=4")
    build.add_argument("--out", required=True, metavar="DIR", help="corpus directory")
    build.add_argument("--root", metavar="DIR", help="folder the config's relative paths are "
                       "read against (replaces the config's root)")
    build.add_argument("--overwrite", action="store_true",
                       help="replace the corpus that --out holds already")
    vocab = actions.add("vocab", VOCAB_HELP, VOCAB_DESCRIPTION)
    vocab.add_argument("corpus", metavar="CORPUS", help="a corpus directory (`corpus build`)")
    vocab.add_argument("--out", required=True, metavar="DIR", help="tokenizer directory")
    vocab.add_argument("--splits", metavar="A,B", help="splits to read (default: every split "
                       "but minival, whose coverage is printed)")


def config(args: argparse.Namespace):
    """The corpus config of `build`: --config, --set, then --root."""
    from pipeline.corpus.config import CorpusConfig

    cfg = resolve(CorpusConfig(), args.config, args.sets)
    return cfg if args.root is None else replace(cfg, root=args.root)


def run(args: argparse.Namespace) -> int:
    return {"build": _build, "vocab": _vocab}[args.corpus_verb](args)


def _build(args: argparse.Namespace) -> int:
    from pipeline.corpus.build import build_corpus
    from pipeline.corpus.stats import format_table

    stats = build_corpus(config(args), Path(args.out), overwrite=args.overwrite)
    print(format_table(stats))
    print(f"corpus written to {args.out}")
    return 0


def _vocab(args: argparse.Namespace) -> int:
    from pipeline.corpus.vocab import corpus_vocabulary, write_tokenizer

    splits = args.splits.split(",") if args.splits else None
    vocabulary = corpus_vocabulary(args.corpus, splits)
    tokenizer = write_tokenizer(vocabulary, writable_dir(args.out))
    read = sum(vocabulary.counts.values())
    print(f"{len(vocabulary.words):,} words ({read:,} in the text read); "
          f"the most frequent: {', '.join(vocabulary.words[:8])}")
    if vocabulary.held_out:
        print(f"{vocabulary.held_out}: {vocabulary.coverage:.2%} of its "
              f"{vocabulary.held_out_words:,} words are in the vocabulary")
    print(f"tokenizer of {tokenizer.vocab_size:,} ids written to {args.out}: "
          f"--set data.tokenizer={args.out}")
    return 0
