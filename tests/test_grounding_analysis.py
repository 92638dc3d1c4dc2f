"""`pipeline analyze grounding` on the world's Flickr30K Entities: the report's per-head entity
accuracies equal a caption-by-caption recomputation written here from the files and the model's
own attention maps, the four architectures give their text -> region heads, and what cannot be
analysed is refused with the file named."""

from __future__ import annotations

import dataclasses
import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from model.archs import ARCHS
from model.checkpoints.formats import save_ours
from model.region_attention import text_to_regions
from pipeline.cli import main
from pipeline.common.text import encode_texts, load_tokenizer
from pipeline.finetune.data import Features
from shards.batch import collate_regions

SPLIT = "train"
FEATURE_DIM = 64  # the bundled world detector's region features


def tiny_config(arch: str):
    """The architecture's tiny config on the world detector's features and BERT's vocabulary."""
    return dataclasses.replace(ARCHS[arch].config.tiny(), visual_feat_dim=FEATURE_DIM,
                               vocab_size=30522)


def tiny_checkpoint(arch: str, directory: Path, seed: int = 0) -> Path:
    torch.manual_seed(seed)
    config = tiny_config(arch)
    save_ours(directory, arch, config, ARCHS[arch].encoder(config).state_dict())
    return directory


def reference_entity_accuracy(run: Path, world: Path, shards: Path, max_text_length: int,
                              max_boxes: int) -> tuple[np.ndarray, float, int]:
    """Per head (L, heads) accuracy %, baseline %, entity count, caption by caption: phrases
    found with a regex, boxes read from the XML (union of the chain's, xmin - 1 .. xmax), each
    word's pieces from tokenizer.tokenize, the phrase's row the mean over words of the mean
    over pieces of VisualBERT's attention from the text to the regions."""
    from model.checkpoints.formats import load_checkpoint

    loaded = load_checkpoint(run)
    encoder = ARCHS["visualbert"].encoder(loaded.config)
    encoder.load_state_dict(loaded.state_dict)
    encoder.eval()
    tokenizer = load_tokenizer()
    features = Features.open([str(shards)])
    root = world / "flickr30k_entities"
    correct, baseline, count = None, 0, 0
    for image_id in (root / f"{SPLIT}.txt").read_text().split():
        boxes: dict[int, list[list[float]]] = {}
        for obj in ET.parse(root / "Annotations" / f"{image_id}.xml").getroot().iter("object"):
            box = obj.find("bndbox")
            if box is None:
                continue
            b = [float(box.find(k).text) for k in ("xmin", "ymin", "xmax", "ymax")]
            for name in obj.iter("name"):
                boxes.setdefault(int(name.text), []).append([b[0] - 1, b[1] - 1, b[2], b[3]])
        sample = features[f"flickr30k-{image_id}"]
        regions = collate_regions([sample], max_boxes=max_boxes)
        region_boxes = sample.arrays["boxes"][:max_boxes].astype(np.float64)
        confident = int(np.argmax(sample.arrays["object_conf"][:max_boxes]))
        for line in (root / "Sentences" / f"{image_id}.txt").read_text().splitlines():
            words, phrases, chain = [], [], None
            for token in line.split():
                if token.startswith("[/EN#"):
                    chain = int(token.split("/")[1][3:])
                    phrases.append((chain, []))
                    continue
                if chain is not None:
                    phrases[-1][1].append(len(words))
                words.append(token.rstrip("]"))
                if token.endswith("]"):
                    chain = None
            text = encode_texts(tokenizer, [" ".join(words)], max_text_length)
            with torch.no_grad():
                out = encoder(**text, **regions.model_inputs(), output_attentions=True)
            T = text["input_ids"].shape[1]
            maps = torch.stack(out.attentions)[:, 0, :, :, T:].double().numpy()  # (L, H, T+N, N)
            starts, position = [], 1
            for word in words:
                n = len(tokenizer.tokenize(word))
                starts.append(list(range(position, position + n)))
                position += n
            for chain, phrase in phrases:
                if chain not in boxes:
                    continue
                pieces = [starts[w] for w in phrase]
                if any(p >= T - 1 for ps in pieces for p in ps):
                    continue
                chain_boxes = np.array(boxes[chain])
                target = np.r_[chain_boxes[:, :2].min(0), chain_boxes[:, 2:].max(0)]
                row = np.mean([maps[:, :, ps, :].mean(2) for ps in pieces], axis=0)  # (L, H, N)
                hit = iou(region_boxes, target) >= 0.5
                right = hit[row.argmax(-1)]
                correct = right.astype(int) if correct is None else correct + right
                baseline += int(hit[confident])
                count += 1
    return 100.0 * correct / count, 100.0 * baseline / count, count


def iou(regions: np.ndarray, t: np.ndarray) -> np.ndarray:
    x1, y1 = np.maximum(regions[:, 0], t[0]), np.maximum(regions[:, 1], t[1])
    x2, y2 = np.minimum(regions[:, 2], t[2]), np.minimum(regions[:, 3], t[3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    area = (regions[:, 2] - regions[:, 0]) * (regions[:, 3] - regions[:, 1])
    return inter / (area + (t[2] - t[0]) * (t[3] - t[1]) - inter)


def analyze(run: Path, world: Path, shards: Path, out: Path, *extra: str) -> dict:
    assert main(["analyze", "grounding", "--run", str(run), "--shards", str(shards),
                 "--entities", str(world / "flickr30k_entities"), "--split", SPLIT,
                 "--out", str(out), "--max-text-length", "40", "--batch-size", "3",
                 *extra]) == 0
    return json.loads((out / "report.json").read_text())


def test_the_report_equals_a_caption_by_caption_recomputation(pretrain_world, flickr_shards,
                                                              tmp_path, capsys):
    run = tiny_checkpoint("visualbert", tmp_path / "visualbert")
    report = analyze(run, pretrain_world.world, flickr_shards, tmp_path / "out")
    accuracy, baseline, count = reference_entity_accuracy(run, pretrain_world.world,
                                                          flickr_shards, 40, 36)
    entity = report["entity"]
    assert entity["count"] == count > 10
    assert entity["baseline"] == pytest.approx(baseline, abs=0.01)
    np.testing.assert_allclose(entity["accuracy"], accuracy, atol=0.01)
    assert report["layers"] == ["1", "2"] and report["heads"] == len(entity["accuracy"][0])
    # the world's gold parses: relations counted, biggest first
    relations = report["syntactic"]
    assert {"det", "amod", "nsubj"} <= set(relations)
    counts = [r["count"] for r in relations.values()]
    assert counts == sorted(counts, reverse=True)
    printed = capsys.readouterr().out
    assert "entity grounding: best head" in printed
    assert (tmp_path / "out" / "heatmap.png").is_file()
    assert (tmp_path / "out" / "relations.png").is_file()
    assert list((tmp_path / "out").glob("example_*.png"))  # the shards kept their images


@pytest.mark.parametrize("arch", ["lxmert", "vilbert", "vlbert"])
def test_every_architecture_gives_its_text_to_region_heads(arch, pretrain_world, flickr_shards,
                                                           tmp_path):
    run = tiny_checkpoint(arch, tmp_path / arch)
    report = analyze(run, pretrain_world.world, flickr_shards, tmp_path / "out", "--examples",
                     "0")
    config = tiny_config(arch)
    layers = {"lxmert": "cross_layers", "vilbert": "text_coattn_layers", "vlbert": "num_layers"}
    count = getattr(config, layers[arch])
    assert len(report["layers"]) == (len(count) if arch == "vilbert" else count)
    assert report["entity"]["count"] > 10
    # cross-attention rows are over the regions only: LXMERT's give them everything
    share = np.array(report["entity"]["image_share"])
    if arch == "lxmert":
        np.testing.assert_allclose(share, 1.0, atol=1e-5)
    else:
        assert ((share > 0) & (share < 1)).all()


def test_one_stream_maps_are_the_text_rows_and_region_columns(pretrain_world, flickr_shards):
    torch.manual_seed(0)
    encoder = ARCHS["vlbert"].encoder(tiny_config("vlbert")).eval()
    sample = Features.open([str(flickr_shards)])[f"flickr30k-{_first_image(pretrain_world)}"]
    regions = collate_regions([sample], max_boxes=10)
    text = encode_texts(load_tokenizer(), ["a red ball on a tiled floor ."], 20)
    inputs = {**text, **regions.model_inputs()}
    with torch.no_grad():
        got = text_to_regions("vlbert", encoder, inputs)
        probs = encoder(**inputs, output_attentions=True).attentions
    T, N = text["input_ids"].shape[1], regions.features.shape[1]
    assert got.maps.shape == (1, len(probs), probs[0].shape[1], T, N)
    assert torch.equal(got.maps[0, 1], probs[1][0, :, :T, T:T + N])  # [END] column left out


def _first_image(world) -> str:
    return (world.world / "flickr30k_entities" / f"{SPLIT}.txt").read_text().split()[0]


def test_what_cannot_be_analysed_is_refused_naming_the_file(pretrain_world, flickr_shards,
                                                           tmp_path, capsys):
    run = tiny_checkpoint("visualbert", tmp_path / "visualbert")
    entities = pretrain_world.world / "flickr30k_entities"
    base = ["analyze", "grounding", "--run", str(run), "--entities", str(entities), "--split",
            SPLIT, "--out", str(tmp_path / "out")]
    # shards of other images
    assert main([*base, "--shards", str(pretrain_world.shards[0])]) == 2
    assert "none of the" in capsys.readouterr().err
    # a parses file that is not there
    assert main([*base, "--shards", str(flickr_shards), "--parses",
                 str(tmp_path / "nope.conllu")]) == 2
    assert "nope.conllu: no such file" in capsys.readouterr().err
    # not a checkpoint
    assert main([*base[:3], str(tmp_path), *base[4:], "--shards", str(flickr_shards)]) == 2
    assert f"{tmp_path}: neither a run" in capsys.readouterr().err
    # spaCy is not installed here: one line that says how to install it
    assert main([*base, "--shards", str(flickr_shards), "--spacy", "en_core_web_sm"]) == 2
    assert "pip install spacy" in capsys.readouterr().err


def test_a_malformed_caption_or_parse_is_reported_and_skipped_not_fatal(pretrain_world,
                                                                       flickr_shards, tmp_path,
                                                                       capsys):
    import shutil

    entities = tmp_path / "entities"
    shutil.copytree(pretrain_world.world / "flickr30k_entities", entities)
    first = (entities / f"{SPLIT}.txt").read_text().split()[0]
    sentences = entities / "Sentences" / f"{first}.txt"
    lines = sentences.read_text().splitlines()
    sentences.write_text("\n".join(["[/EN#1/other an unclosed phrase ."] + lines[1:]) + "\n")
    parses = entities / "parses.conllu"
    text = parses.read_text()
    parses.write_text(text.replace("\t", " ", 1))  # the first block's first row: one column
    run = tiny_checkpoint("visualbert", tmp_path / "visualbert")
    world = tmp_path / "world"
    world.mkdir()
    (world / "flickr30k_entities").symlink_to(entities)
    report = analyze(run, world, flickr_shards, tmp_path / "out", "--examples", "0")
    assert report["skipped"]["malformed caption lines or parses"] == 2
    err = capsys.readouterr().err
    assert f"Sentences/{first}.txt:1" in err and "parses.conllu" in err
    assert report["entity"]["count"] > 10
