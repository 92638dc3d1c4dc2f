"""`pipeline`: the command line. One verb -> one `run_<verb>` function.

Every verb takes `--config FILE` (YAML) and repeatable `--set key=value` overrides, validated
against that verb's config dataclass; heavy imports happen inside the verbs so `--help` is instant.
"""

from __future__ import annotations

import argparse
import sys

from pipeline.bench_model import add_args as add_bench_model_args
from pipeline.bench_pretrain import __doc__ as BENCH_PRETRAIN_DESCRIPTION
from pipeline.bench_pretrain import add_args as add_bench_pretrain_args
from pipeline.config import ConfigError
from pipeline.convert import DESCRIPTION as CONVERT_DESCRIPTION
from pipeline.convert import add_convert_args
from pipeline.datasets import READERS, DatasetError
from pipeline.evaluate.commands import EVALUATE_DESCRIPTION, add_evaluate_args
from pipeline.evaluate.inputs import EvaluationError
from pipeline.finetune.examples import ExamplesError, TaskDataError
from pipeline.finetune.commands import (
    FINETUNE_DESCRIPTION,
    PREDICT_DESCRIPTION,
    add_finetune_args,
    add_predict_args,
)
from pipeline.pretrain.commands import (
    PRETRAIN_DESCRIPTION,
    add_plot_args,
    add_pretrain_args,
)

DESCRIPTION = """\
The open pipeline for vision-and-language pretraining: raw images in, bottom-up-attention region
features out (WebDataset shards), cross-modal transformers trained on them.

Typical use:
  pipeline demo                                  world -> features -> pretrain -> VQA / NLVR2 scores
  pipeline extract --dataset folder --root IMGS --out FEATS --weights faster_rcnn_from_caffe_attr.pkl
  pipeline shards verify FEATS                   check a shard set end to end
  pipeline bench extract                         images/s and time per stage
  pipeline bench model --arch lxmert             training samples/s, ours against transformers
  pipeline bench pretrain                        pretraining samples/s, 1 -> 2 Ray Train workers
  pipeline convert model_LXRT.pth --to hf --out DIR   official LXMERT weights -> Hugging Face
  pipeline corpus build --config configs/corpus/lxmert.yaml --root DATA --out CORPUS
                                                 pretraining corpus from the annotation files
  pipeline pretrain --config configs/pretrain/lxmert.yaml --out RUN --set data.corpus=CORPUS ...
                                                 pretrain on shards + corpus (Ray Train)
  pipeline plot RUN                              loss curves of a run as a PNG
  pipeline finetune vqa --from RUN/checkpoints/step_N/model --out FT --set data.root=DATA/vqa ...
                                                 fine-tune on VQA / GQA / NLVR2 (Ray Train)
  pipeline predict vqa --run FT --subset val2014 --out P.json   submission file of a subset
  pipeline evaluate vqa --predictions P.json --annotations A.json --questions Q.json
                                                 official VQA v2 / GQA / NLVR2 metrics
Run `pipeline VERB --help` for each verb's options.
"""


def _config_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("configuration")
    group.add_argument("--config", metavar="FILE", help="YAML file with config values")
    group.add_argument(
        "--set",
        dest="sets",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="override one config value, e.g. --set detector.depth=18 (repeatable; "
        "applied after --config; unknown keys are errors)",
    )


def _extract_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dataset",
        default="folder",
        choices=sorted(READERS),
        help="dataset reader (default: folder); the layout each expects under --root is in "
        "README.md, 'Dataset layouts'",
    )
    parser.add_argument(
        "--root", required=True, help="dataset root directory (for --dataset list: the list file)"
    )
    parser.add_argument("--out", required=True, help="output directory for the shards")
    parser.add_argument(
        "--weights",
        help="detector checkpoint: detectron2 .pkl, Hugging Face pytorch_model.bin or our "
        ".safetensors (default: random initialisation, for testing only)",
    )
    parser.add_argument(
        "--preset",
        choices=["caffe", "lxmert", "pb-demo", "hf-demo"],
        help="feature convention: caffe (10-100 boxes, default), lxmert (36), pb-demo "
        "(py-bottom-up-attention demo), hf-demo (Hugging Face frcnn-vg-finetuned demo)",
    )
    parser.add_argument(
        "--boxes",
        choices=["adaptive", "fixed", "given"],
        help="box selection mode, overriding the preset's",
    )
    parser.add_argument(
        "--given-boxes",
        metavar="FILE",
        help="JSON {image_id: [[x1, y1, x2, y2], ...]} in original pixels, for --boxes given",
    )
    parser.add_argument("--device", help="cpu, cuda or cuda:N (default: cuda if available)")
    parser.add_argument(
        "--strict", action="store_true", help="exit non-zero if any image fails"
    )
    _engine_args(parser)


def _engine_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("engine (may change when a run is resumed)")
    group.add_argument(
        "--engine",
        choices=["ray", "local"],
        help="ray: Ray Data decode tasks and detector actors (default); local: one process",
    )
    group.add_argument(
        "--address", help="Ray cluster to join, e.g. auto or HEAD_IP:6379 (default: start a "
        "local Ray for this run)"
    )
    group.add_argument(
        "--batch-size", type=int, help="images per detector batch (default 4; features agree "
        "across batch sizes to ~1e-4, bitwise only for the same batch size)"
    )
    group.add_argument(
        "--actors", type=int, help="detector actors (default: one per GPU, else one on the CPUs)"
    )
    group.add_argument(
        "--gpus-per-actor", type=float, help="GPUs per actor, e.g. 0.5 (default: 1 if the "
        "cluster has GPUs, else 0)"
    )
    group.add_argument(
        "--decoders", type=int, help="decode tasks running at once (default: the CPUs the "
        "actors leave)"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipeline", description=DESCRIPTION, formatter_class=argparse.RawTextHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    extract = verbs.add_parser(
        "extract",
        help="detect regions and write feature shards",
        description="Run the bottom-up-attention detector over a dataset's images and write "
        "WebDataset shards of boxes, labels, attributes and region features. Re-running the "
        "same command resumes: finished shards are kept.",
    )
    _extract_args(extract)
    _config_args(extract)

    show = verbs.add_parser(
        "show",
        help="draw one extracted sample's boxes and labels on its image",
        description="Draw the regions of one sample of a shard set on its image and save the "
        "picture, to check an extraction by eye: each box in its own colour, labelled with its "
        "top attribute (named above --set min_attr_conf=X, default 0.1), object name and "
        "confidence, most confident first. The image is the one stored in the sample "
        "(output.keep_images), else the dataset's file: the dataset and root recorded in "
        "DIR/extract_config.yaml, or the root given by --root.",
    )
    show.add_argument("--shards", required=True, metavar="DIR", help="shard directory")
    show.add_argument(
        "--key",
        required=True,
        help="sample key, {dataset}-{escaped image id}, e.g. folder-cat_01 (an unknown key "
        "lists the closest ones)",
    )
    show.add_argument(
        "--out", required=True, metavar="FILE", help="picture to write, e.g. look.png"
    )
    show.add_argument(
        "--root", metavar="DIR", help="dataset root, replacing the recorded one (images moved)"
    )
    show.add_argument(
        "--max-boxes",
        type=int,
        metavar="N",
        help="draw at most N boxes, the most confident (default: 36)",
    )
    show.add_argument(
        "--min-conf",
        type=float,
        metavar="X",
        help="leave out boxes with object confidence below X (default: 0)",
    )
    _config_args(show)

    shards = verbs.add_parser("shards", help="inspect, verify and convert feature shards")
    shard_verbs = shards.add_subparsers(dest="shards_verb", metavar="ACTION", required=True)
    verify = shard_verbs.add_parser(
        "verify",
        help="check schema, checksums, counts, NaN/inf and box bounds",
        description="Check every shard of a shard set; print every problem with its shard and "
        "key; exit 1 if there is any.",
    )
    verify.add_argument("dir", help="shard directory")
    _config_args(verify)
    imp = shard_verbs.add_parser(
        "import-tsv",
        help="convert an LXMERT/bottom-up-attention TSV feature file into shards",
        description="Stream an LXMERT-style TSV (img_id, img_h, img_w, objects_id, objects_conf, "
        "attrs_id, attrs_conf, num_boxes, boxes, features) into schema-v1 shards.",
    )
    imp.add_argument("tsv", help="TSV feature file")
    imp.add_argument("--out", required=True, help="output shard directory")
    imp.add_argument("--dataset", required=True, help="dataset name recorded in the keys, e.g. coco")
    imp.add_argument("--split", default="", help="split recorded in the metadata")
    _config_args(imp)
    exp = shard_verbs.add_parser(
        "export-tsv",
        help="write shards back as an LXMERT-style TSV",
        description="Write every sample of a shard set as one LXMERT-style TSV row.",
    )
    exp.add_argument("dir", help="shard directory")
    exp.add_argument("--out", required=True, help="output TSV file")
    _config_args(exp)

    bench = verbs.add_parser("bench", help="benchmarks")
    bench_verbs = bench.add_subparsers(dest="bench_verb", metavar="WHAT", required=True)
    bench_extract = bench_verbs.add_parser(
        "extract",
        help="images/s and time per stage of the extractor",
        description="Time the extractor stage by stage (decode, preprocess, backbone, RPN, RoI "
        "head, selection, write) for each batch size and precision; with --ray, also the Ray "
        "engine on the same images, and its overhead against the in-process engine.",
    )
    bench_extract.add_argument("--images", help="folder of images (default: the bundled samples)")
    bench_extract.add_argument("--num-images", type=int, default=16, help="images per setting")
    bench_extract.add_argument("--batch-sizes", default="1,4", help="comma-separated batch sizes")
    bench_extract.add_argument(
        "--precisions", default="fp32", help="comma-separated: fp32, bf16, fp16 (GPU only)"
    )
    bench_extract.add_argument("--weights", help="detector checkpoint (default: random init)")
    bench_extract.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    bench_extract.add_argument(
        "--ray", action="store_true", help="also run the Ray engine (a local Ray; actors, "
        "decoders via --set run.actors=N ...) and report its overhead"
    )
    _config_args(bench_extract)
    bench_pretrain = bench_verbs.add_parser(
        "pretrain",
        help="pretraining samples/s and its scaling from 1 to N workers",
        description=BENCH_PRETRAIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bench_pretrain_args(bench_pretrain)
    bench_model = bench_verbs.add_parser(
        "model",
        help="training samples/s of our model against transformers' (same weights and work)",
        description="Time training steps (forward, backward, AdamW) of our model and of the "
        "transformers implementation with the same weights, batch and loss, alternating rounds, "
        "and print samples/s, ms/step, peak GPU memory and the ratio ours / transformers. Also "
        "runs as `python -m pipeline.bench_model` with only torch and transformers installed.",
    )
    add_bench_model_args(bench_model)

    world = verbs.add_parser("world", help="the synthetic world: images and annotations in real formats")
    world_verbs = world.add_subparsers(dest="world_verb", metavar="ACTION", required=True)
    generate = world_verbs.add_parser(
        "generate",
        help="generate scenes and write them as COCO, Visual Genome, VQA, GQA, NLVR2 and CC3M files",
        description="Generate a deterministic world of rendered scenes with ground truth, captions "
        "and questions, written in the official layouts of COCO, Visual Genome, VQA v2, GQA, "
        "NLVR2 and CC3M (img2dataset shards).",
    )
    generate.add_argument("--out", required=True, help="output directory")
    generate.add_argument("--images", type=int, help="number of COCO/Visual Genome scenes")
    generate.add_argument("--seed", type=int, help="random seed (same seed, same bytes)")
    _config_args(generate)

    detector = verbs.add_parser("detector", help="train and evaluate the region detector")
    detector_verbs = detector.add_subparsers(dest="detector_verb", metavar="ACTION", required=True)
    train = detector_verbs.add_parser(
        "train",
        help="train the bottom-up-attention detector on Visual Genome-format ground truth",
        description="Train the detector (RPN, box classifier/regressor, attribute head) on a "
        "Visual Genome-format dataset (e.g. a generated world), report mAP@0.5 and attribute "
        "accuracy on the held-out images, and save a checkpoint `pipeline extract` loads.",
    )
    train.add_argument("--data", required=True, help="dataset root (a generated world)")
    train.add_argument("--out", required=True, help="output directory for the checkpoint and metrics")
    train.add_argument("--device", help="cpu or cuda (default: cuda if available)")
    _config_args(train)

    corpus = verbs.add_parser("corpus", help="build the pretraining corpus from annotation files")
    corpus_verbs = corpus.add_subparsers(dest="corpus_verb", metavar="ACTION", required=True)
    corpus_build = corpus_verbs.add_parser(
        "build",
        help="COCO / VG / VQA / GQA / CC3M annotations -> LXMERT-style corpus splits and answers",
        description="Read the official annotation files named by the config, split them the "
        "LXMERT way (train, nominival, minival held out, vgnococo, cc3m), build the answer table "
        "from the training splits, write {split}.jsonl, answers.json, text.txt, stats.json and "
        "corpus.yaml into --out, and print the statistics table.",
    )
    corpus_build.add_argument("--out", required=True, metavar="DIR", help="corpus directory")
    corpus_build.add_argument(
        "--root", metavar="DIR", help="folder the config's relative paths are read against "
        "(replaces the config's root)"
    )
    _config_args(corpus_build)

    pretrain = verbs.add_parser(
        "pretrain",
        help="pretrain LXMERT / VisualBERT / VL-BERT / ViLBERT on shards + corpus",
        description=PRETRAIN_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_pretrain_args(pretrain)
    _config_args(pretrain)

    plot = verbs.add_parser("plot", help="loss curves of a pretraining run as a PNG")
    add_plot_args(plot)

    finetune = verbs.add_parser(
        "finetune",
        help="fine-tune on VQA, GQA or NLVR2 from a checkpoint (or from scratch)",
        description=FINETUNE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_finetune_args(finetune)
    _config_args(finetune)

    predict = verbs.add_parser(
        "predict",
        help="a fine-tuned run's submission file for a subset (VQA / GQA JSON, NLVR2 CSV)",
        description=PREDICT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_predict_args(predict)

    evaluate = verbs.add_parser(
        "evaluate",
        help="official metrics of VQA v2, GQA and NLVR2 for a predictions file",
        description=EVALUATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_evaluate_args(evaluate)

    convert = verbs.add_parser(
        "convert",
        help="convert a model checkpoint between our, Hugging Face and official LXMERT formats",
        description=CONVERT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_convert_args(convert)

    demo = verbs.add_parser(
        "demo",
        help="the whole pipeline learning on a laptop: world -> features -> LXMERT -> VQA, NLVR2",
        description="Generate a synthetic world, extract its images with Ray and the bundled "
        "detector, pretrain a small LXMERT, fine-tune VQA and NLVR2 (pretrained, from scratch, "
        "language-only), score the held-out splits with the official metrics; prints the table, "
        "writes OUT/results.json and OUT/pictures/. About 11 minutes on 2 CPU cores, two training "
        "runs at a time; a second run reuses what the first finished. Sizes and world: --set "
        "world_images=..., --set vqa_epochs=..., --set shapes=[ball,box] (see pipeline/demo.py).",
    )
    demo.add_argument("--out", default="demo_out", help="output directory (default: demo_out)")
    _config_args(demo)
    return parser


def run_corpus(args: argparse.Namespace) -> int:
    """`pipeline corpus build`: the work is in pipeline/corpus/build.py."""
    from dataclasses import replace
    from pathlib import Path

    from pipeline.config import resolve
    from pipeline.corpus.build import build_corpus
    from pipeline.corpus.config import CorpusConfig
    from pipeline.corpus.sources import CorpusError
    from pipeline.corpus.stats import format_table

    config = resolve(CorpusConfig(), args.config, args.sets)
    if args.root is not None:
        config = replace(config, root=args.root)
    try:
        stats = build_corpus(config, Path(args.out))
    except CorpusError as err:
        print(f"pipeline corpus build: {err}", file=sys.stderr)
        return 2
    print(format_table(stats))
    print(f"corpus written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "extract":
            from pipeline.extract import run_extract

            return run_extract(args)
        if args.verb == "show":
            from pipeline.show import run_show

            return run_show(args)
        if args.verb == "shards":
            from pipeline import shards_cli

            return shards_cli.run_shards(args)
        if args.verb == "bench" and args.bench_verb == "pretrain":
            from pipeline.bench_pretrain import run_bench_pretrain

            return run_bench_pretrain(args)
        if args.verb == "bench" and args.bench_verb == "model":
            from pipeline.bench_model import run_bench_model

            return run_bench_model(args)
        if args.verb == "bench":
            from pipeline.bench import run_bench

            return run_bench(args)
        if args.verb == "world":
            from pipeline.world.generate import run_world_generate

            return run_world_generate(args)
        if args.verb == "detector":
            from pipeline.detector_train import run_detector_train

            return run_detector_train(args)
        if args.verb == "corpus":
            return run_corpus(args)
        if args.verb == "pretrain":
            from pipeline.pretrain.commands import run_pretrain_verb

            return run_pretrain_verb(args)
        if args.verb == "plot":
            from pipeline.pretrain.commands import run_plot_verb

            return run_plot_verb(args)
        if args.verb == "finetune":
            from pipeline.finetune.commands import run_finetune_verb

            return run_finetune_verb(args)
        if args.verb == "predict":
            from pipeline.finetune.commands import run_predict_verb

            return run_predict_verb(args)
        if args.verb == "evaluate":
            from pipeline.evaluate.commands import run_evaluate_verb

            return run_evaluate_verb(args)
        if args.verb == "convert":
            from pipeline.convert import run_convert

            return run_convert(args)
        if args.verb == "demo":
            from pipeline.demo import run_demo

            return run_demo(args)
    except ConfigError as err:
        print(f"pipeline: config error: {err}", file=sys.stderr)
        return 2
    except DatasetError as err:
        print(f"pipeline: dataset error: {err}", file=sys.stderr)
        return 2
    except EvaluationError as err:
        print(f"pipeline: evaluation error: {err}", file=sys.stderr)
        return 2
    except (ExamplesError, TaskDataError) as err:
        print(f"pipeline: task data error: {err}", file=sys.stderr)
        return 2
    raise AssertionError(f"unhandled verb {args.verb}")


if __name__ == "__main__":
    sys.exit(main())
