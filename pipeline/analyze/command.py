"""`pipeline analyze grounding`: what a trained model's attention heads ground (run.py does the
work, report.py and pictures.py write it)."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

from pipeline.common.arguments import Actions

MAX_SHOWN = 5  # malformed lines printed; all are counted in the report

HELP = "analyse a trained model: which attention heads ground words in image regions"
DESCRIPTION = """\
What does the model look at? (Li et al. 2020, "What Does BERT with Vision Look At?", §3.)

`pipeline analyze grounding` treats every attention head as a classifier: for each entity phrase
of a Flickr30K Entities caption, the head's prediction is the image region its words attend to
most (other words not compared; a word's row is the mean of its wordpieces', a phrase's the mean
of its words'); it is right when the region's IoU with the entity's box (the union of its boxes)
is >= 0.5. The baseline always picks the region the detector is most confident of. Syntactic
grounding: for each dependency arc with one end in a boxed phrase, does the other word attend to
that phrase's region? (accuracy per relation; parses from --parses FILE.conllu, or spaCy with
--spacy MODEL when installed). A head is "active" when > 20% of its attention goes to regions.

Heads: every self-attention layer of VisualBERT and VL-BERT (text rows, region columns), the
cross-modality text -> vision heads of LXMERT, the co-attention text -> visual heads of ViLBERT.

Writes OUT/report.json, OUT/heatmap.png (layer x head entity accuracy), OUT/relations.png
(best head per relation against the baseline) and OUT/example_NN.png (a phrase, its box in green,
the best head's region in red), and prints the summary.

  pipeline extract --dataset flickr30k --root DATA/flickr30k --out FEATS ...
  pipeline analyze grounding --run RUN --shards FEATS --entities DATA/flickr30k_entities \\
      --parses parses.conllu --out grounding
  pipeline analyze grounding --run RUN --random-init ...    the same architecture, untrained
"""


def add_args(parser: argparse.ArgumentParser) -> None:
    actions = Actions(parser, "analyze_verb")
    grounding = actions.add("grounding", HELP, DESCRIPTION, config=False)
    grounding.add_argument("--run", required=True, metavar="CKPT",
                           help="a `pipeline pretrain` / `finetune` run (its latest checkpoint), "
                           "one of its checkpoints/step_N, or a model checkpoint (ours, Hugging "
                           "Face's, LXMERT's official)")
    grounding.add_argument("--shards", required=True, nargs="+", metavar="FEATS",
                           help="feature shard directories holding the split's Flickr30K images")
    grounding.add_argument("--entities", required=True, metavar="ROOT",
                           help="Flickr30K Entities: ROOT/Sentences, ROOT/Annotations, "
                           "ROOT/{train,val,test}.txt")
    grounding.add_argument("--split", default="val", help="the split analysed (default val, "
                           "as the paper)")
    grounding.add_argument("--out", required=True, help="directory of the report and pictures")
    parses = grounding.add_mutually_exclusive_group()
    parses.add_argument("--parses", metavar="FILE.conllu",
                        help="dependency parses, `# sent_id = IMAGEID_CAPTIONINDEX` per caption "
                        "(default: ROOT/parses.conllu when it exists)")
    parses.add_argument("--spacy", metavar="MODEL",
                        help="parse with this installed spaCy model (e.g. en_core_web_sm)")
    grounding.add_argument("--random-init", action="store_true",
                           help="the run's architecture and config with fresh random weights")
    grounding.add_argument("--seed", type=int, default=0, help="seed of --random-init")
    grounding.add_argument("--images", metavar="DIR",
                           help="the images as DIR/IMAGEID.jpg for the example pictures "
                           "(default: the images kept in the shards, if any)")
    grounding.add_argument("--examples", type=int, default=6,
                           help="example pictures (default 6; 0: none)")
    grounding.add_argument("--batch-size", type=int, default=32, help="captions per forward")
    grounding.add_argument("--max-text-length", type=int,
                           help="wordpieces per caption (default: the run's)")
    grounding.add_argument("--max-boxes", type=int,
                           help="regions per image (default: the run's)")
    grounding.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from pipeline.analyze.cases import Skipped
    from pipeline.analyze.entities import read_entities
    from pipeline.analyze.errors import AnalysisError
    from pipeline.analyze.model import load_analysed_model
    from pipeline.analyze.parses import load_spacy, read_conllu
    from pipeline.analyze.pictures import draw_all
    from pipeline.analyze.report import grounding_report, summary
    from pipeline.analyze.run import analyze, conllu_parser, spacy_parser
    from pipeline.common.devices import pick_device
    from pipeline.finetune.data import Features

    model = load_analysed_model(Path(args.run), random_init=args.random_init, seed=args.seed)
    overrides = {k: v for k, v in (("max_text_length", args.max_text_length),
                                   ("max_boxes", args.max_boxes)) if v is not None}
    model = dataclasses.replace(model, **overrides)
    entities_root = Path(args.entities)
    problems: list = []
    data = read_entities(entities_root, args.split, problems)
    skipped = Skipped()
    parses_file = Path(args.parses) if args.parses else entities_root / "parses.conllu"
    if args.spacy:
        parser = spacy_parser(load_spacy(args.spacy), skipped)
    elif args.parses or parses_file.is_file():
        if not parses_file.is_file():
            raise AnalysisError(f"--parses {parses_file}: no such file")
        parser = conllu_parser(read_conllu(parses_file, problems), skipped)
    else:
        parser = None
        print("no parses (--parses / --spacy): entity grounding only", file=sys.stderr)
    for problem in problems[:MAX_SHOWN]:
        print(f"skipped: {problem}", file=sys.stderr)
    if len(problems) > MAX_SHOWN:
        print(f"... and {len(problems) - MAX_SHOWN} more", file=sys.stderr)
    if problems:
        skipped.add("malformed caption lines or parses", len(problems))
    features = Features.open(args.shards)
    analysis = analyze(model, data, features, parser=parser, skipped=skipped,
                       batch_size=args.batch_size, examples=args.examples,
                       device=pick_device(args.device))
    meta = {"run": str(args.run), "arch": model.arch, "random_init": model.random_init,
            "split": args.split, "entities": str(entities_root),
            "max_text_length": model.max_text_length, "max_boxes": model.max_boxes}
    report = grounding_report(analysis, meta)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    written = draw_all(report, analysis.examples, _image_loader(args.images, features), out)
    print(summary(report))
    print(f"wrote {out / 'report.json'} and {len(written)} pictures in {out}")
    return 0


def _image_loader(images: str | None, features):
    """image key -> PIL image: DIR/IMAGEID.jpg with --images, else the shards' kept image."""
    from PIL import Image

    def load(key: str):
        sample = features[key]
        if images:
            path = Path(images) / f"{sample.meta['image_id']}.jpg"
            return Image.open(path).convert("RGB") if path.is_file() else None
        if sample.image_bytes is None:
            return None
        return Image.open(io.BytesIO(sample.image_bytes)).convert("RGB")
    return load
