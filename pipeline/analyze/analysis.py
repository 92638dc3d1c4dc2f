"""The whole analysis of one model: read the files, run the model over the split, write
report.json and the pictures, print the summary (`pipeline analyze grounding`, and the demo)."""

from __future__ import annotations

import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.analyze.cases import Skipped
from pipeline.analyze.entities import read_entities
from pipeline.analyze.errors import AnalysisError
from pipeline.analyze.model import AnalysisInputs
from pipeline.analyze.parses import load_spacy, read_conllu
from pipeline.analyze.pictures import draw_all
from pipeline.analyze.report import grounding_report, summary
from pipeline.analyze.run import analyze, conllu_parser, spacy_parser
from pipeline.common.devices import pick_device
from pipeline.finetune.data import Features

MAX_SHOWN = 5  # malformed lines printed; all are counted in the report
PARSES_FILE = "parses.conllu"  # looked for in the Entities root when no parses are named


@dataclass(frozen=True)
class GroundingInputs(AnalysisInputs):
    """What `pipeline analyze grounding` reads besides the model and data: the parses (a
    CoNLL-U file, or a spaCy model), the images for the pictures, how many examples to draw."""

    parses: Path | None = None
    spacy: str | None = None
    images: Path | None = None
    examples: int = 6


def analyze_grounding(inputs: GroundingInputs, out: Path) -> dict:
    """Writes out/report.json and the pictures; returns the report."""
    model = inputs.model()
    problems: list = []
    data = read_entities(inputs.entities, inputs.split, problems)
    skipped = Skipped()
    parses = inputs.parses or inputs.entities / PARSES_FILE
    if inputs.spacy:
        parser = spacy_parser(load_spacy(inputs.spacy), skipped)
    elif inputs.parses or parses.is_file():
        if not parses.is_file():
            raise AnalysisError(f"--parses {parses}: no such file")
        parser = conllu_parser(read_conllu(parses, problems), skipped)
    else:
        parser = None
        print("no parses (--parses / --spacy): entity grounding only", file=sys.stderr)
    for problem in problems[:MAX_SHOWN]:
        print(f"skipped: {problem}", file=sys.stderr)
    if len(problems) > MAX_SHOWN:
        print(f"... and {len(problems) - MAX_SHOWN} more", file=sys.stderr)
    if problems:
        skipped.add("malformed caption lines or parses", len(problems))
    features = Features.open(inputs.shards)
    analysis = analyze(model, data, features, parser=parser, skipped=skipped,
                       batch_size=inputs.batch_size, examples=inputs.examples,
                       device=pick_device(inputs.device))
    meta = inputs.meta(model)
    report = grounding_report(analysis, meta)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    written = draw_all(report, analysis.examples, _image_loader(inputs.images, features), out)
    print(summary(report))
    print(f"wrote {out / 'report.json'} and {len(written)} pictures in {out}")
    return report


def _image_loader(images: Path | None, features):
    """image key -> PIL image: DIR/IMAGEID.jpg with --images, else the shards' kept image."""
    from PIL import Image

    def load(key: str):
        sample = features[key]
        if images:
            path = images / f"{sample.meta['image_id']}.jpg"
            return Image.open(path).convert("RGB") if path.is_file() else None
        if sample.image_bytes is None:
            return None
        return Image.open(io.BytesIO(sample.image_bytes)).convert("RGB")
    return load
