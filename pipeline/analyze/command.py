"""`pipeline analyze grounding`: what a trained model's attention heads ground (run.py does the
work, report.py and pictures.py write it); `pipeline analyze cross-modal`: whether its masked LM
uses the image and its region classifier the text (cross_modal.py, cross_modal_report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.common.arguments import Actions

HELP = "analyse a trained model: what its heads ground, whether it uses both modalities"
GROUNDING_HELP = "which attention heads ground words in image regions"
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


CROSS_MODAL_HELP = "does the masked LM use the image, the region classifier the text?"
CROSS_MODAL_DESCRIPTION = """\
The cross-modal influence test (Frank, Bugliarello and Elliott, EMNLP 2021, "Vision-and-Language
or Vision-for-Language?"), on a model with its pretraining heads.

Masked LM: each word of each phrase of a Flickr30K Entities caption in turn is masked and
predicted (a) with every region, (b) with the regions aligned with its phrase removed (IoU >=
0.5 with the phrase's box), (c) with no region. Masked regions: the regions aligned with a
boxed phrase are masked as in pretraining and their object labels (the detector's) predicted
(a) with the whole caption, (b) with the phrase removed, (c) with no text (not for VisualBERT,
which has no region head). Accuracy and loss per word class (colour, shape, material, ground,
noun, other) and their drops: a model that uses the other modality loses accuracy when it is
removed.

Writes OUT/report.json and OUT/cross_modal.png and prints the table.

  pipeline analyze cross-modal --run PRETRAIN_RUN --shards FEATS \\
      --entities DATA/flickr30k_entities --out cross_modal
  pipeline analyze cross-modal --run PRETRAIN_RUN --random-init ...   the same model, untrained
"""


def _model_args(parser: argparse.ArgumentParser, run_help: str) -> None:
    """The options both analyses share: the model, the data, the sizes, the device."""
    parser.add_argument("--run", required=True, metavar="CKPT", help=run_help)
    parser.add_argument("--shards", required=True, nargs="+", metavar="FEATS",
                        help="feature shard directories holding the split's Flickr30K images")
    parser.add_argument("--entities", required=True, metavar="ROOT",
                        help="Flickr30K Entities: ROOT/Sentences, ROOT/Annotations, "
                        "ROOT/{train,val,test}.txt")
    parser.add_argument("--split", default="val", help="the split analysed (default val, "
                        "as the paper)")
    parser.add_argument("--out", required=True, help="directory of the report and pictures")
    parser.add_argument("--random-init", action="store_true",
                        help="the run's architecture and config with fresh random weights")
    parser.add_argument("--seed", type=int, default=0, help="seed of --random-init")
    parser.add_argument("--max-text-length", type=int,
                        help="wordpieces per caption (default: the run's)")
    parser.add_argument("--max-boxes", type=int, help="regions per image (default: the run's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")


def add_args(parser: argparse.ArgumentParser) -> None:
    actions = Actions(parser, "analyze_verb")
    grounding = actions.add("grounding", GROUNDING_HELP, DESCRIPTION)
    _model_args(grounding, "a `pipeline pretrain` / `finetune` run (its latest checkpoint), one "
                "of its checkpoints/step_N, or a model checkpoint (ours, Hugging Face's, "
                "LXMERT's official)")
    parses = grounding.add_mutually_exclusive_group()
    parses.add_argument("--parses", metavar="FILE.conllu",
                        help="dependency parses, `# sent_id = IMAGEID_CAPTIONINDEX` per caption "
                        "(default: ROOT/parses.conllu when it exists)")
    parses.add_argument("--spacy", metavar="MODEL",
                        help="parse with this installed spaCy model (e.g. en_core_web_sm)")
    grounding.add_argument("--images", metavar="DIR",
                           help="the images as DIR/IMAGEID.jpg for the example pictures "
                           "(default: the images kept in the shards, if any)")
    grounding.add_argument("--examples", type=int, default=6,
                           help="example pictures (default 6; 0: none)")
    grounding.add_argument("--batch-size", type=int, default=32, help="captions per forward")
    cross_modal = actions.add("cross-modal", CROSS_MODAL_HELP, CROSS_MODAL_DESCRIPTION)
    _model_args(cross_modal, "a `pipeline pretrain` run (its latest checkpoint), one of its "
                "checkpoints/step_N, or a model file that keeps the pretraining heads "
                "(LXMERT's: ours, Hugging Face's, the official)")
    cross_modal.add_argument("--batch-size", type=int, default=16,
                             help="captions per step (each gives a forward row per masked word "
                             "and condition)")


def run(args: argparse.Namespace) -> int:
    if args.analyze_verb == "cross-modal":
        from pipeline.analyze.cross_modal_report import analyze_cross_modal
        from pipeline.analyze.model import AnalysisInputs

        analyze_cross_modal(AnalysisInputs(
            run=Path(args.run), shards=list(args.shards), entities=Path(args.entities),
            split=args.split, random_init=args.random_init, seed=args.seed,
            batch_size=args.batch_size, max_text_length=args.max_text_length,
            max_boxes=args.max_boxes, device=args.device), Path(args.out))
        return 0
    from pipeline.analyze.analysis import GroundingInputs, analyze_grounding

    analyze_grounding(GroundingInputs(
        run=Path(args.run), shards=list(args.shards), entities=Path(args.entities),
        split=args.split, parses=Path(args.parses) if args.parses else None, spacy=args.spacy,
        random_init=args.random_init, seed=args.seed,
        images=Path(args.images) if args.images else None, examples=args.examples,
        batch_size=args.batch_size, max_text_length=args.max_text_length,
        max_boxes=args.max_boxes, device=args.device), Path(args.out))
    return 0
