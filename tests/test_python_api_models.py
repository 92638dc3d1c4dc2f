"""The models' front door in Python: `model.load(path)` reads every format `pipeline convert`
reads (ours, Hugging Face's, the authors' released files with their config file) into the class
the checkpoint was saved from, weights equal to the written ones, in eval mode; `model.save`
writes our format, which loads back equal; a fine-tuned run answers in Python
(`pipeline.finetune.load_predictor`) what `pipeline predict` writes for the same inputs."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_finetune import TINY, finetune, nlvr2_sets
from test_finetune_released import RELEASED

import model
from extractor.features import RegionFeatures
from model.archs import ARCHS
from model.checkpoints import save_hf, save_official
from model.lxmert import LxmertConfig
from model.visualbert import VisualBertConfig
from pipeline.cli import main
from pipeline.evaluate.flickr30k import read_retrieval_predictions
from pipeline.finetune import load_predictor
from pipeline.finetune.answers import AnswerVocab
from pipeline.finetune.data import subset_examples
from shards.schema import Sample
from shards.store import FeatureStore

WRITERS = {"hf": save_hf, "official": save_official}


def _lxmert(path: Path) -> tuple[object, str]:
    return LxmertConfig.tiny(), ""


def _visualbert_hf(path: Path) -> tuple[object, str]:
    return VisualBertConfig.tiny(), ""


# (arch, format) -> (file or directory name, the model's config and the authors' config file)
CASES = {
    ("lxmert", "hf"): ("lxmert-hf", _lxmert),
    ("lxmert", "official"): ("Epoch20_LXRT.pth", _lxmert),
    ("visualbert", "hf"): ("visualbert-hf", _visualbert_hf),
    **{(arch, "official"): RELEASED[arch] for arch in RELEASED},
}


def _assert_same_weights(loaded: torch.nn.Module, written: torch.nn.Module) -> None:
    assert type(loaded) is type(written)
    ours, theirs = loaded.state_dict(), written.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


@pytest.mark.parametrize("arch, fmt", sorted(CASES), ids=lambda v: str(v))
def test_load_reads_every_format_into_the_saved_class(arch, fmt, tmp_path):
    name, make = CASES[arch, fmt]
    path = tmp_path / name
    config, config_file = make(path)
    torch.manual_seed(0)
    written = ARCHS[arch].pretraining(config)
    WRITERS[fmt](path, arch, config, written.state_dict())

    options = {"config_file": config_file} if config_file else {}
    if (arch, fmt) == ("lxmert", "official"):  # the one size these files do not record
        options = {"num_heads": config.num_heads}
    loaded = model.load(path, **options)
    _assert_same_weights(loaded, written)
    assert not loaded.training

    encoder = model.load(path, drop_heads=True, **options)
    assert type(encoder) is ARCHS[arch].encoder
    with pytest.raises(model.CheckpointError, match="not"):
        model.load(path, "vilbert" if arch != "vilbert" else "lxmert", **options)


@pytest.mark.parametrize("arch", sorted(ARCHS))
def test_save_then_load_gives_the_same_model(arch, tmp_path):
    torch.manual_seed(1)
    written = ARCHS[arch].pretraining(ARCHS[arch].config.tiny())
    assert model.save(written, tmp_path / arch) == tmp_path / arch
    loaded = model.load(tmp_path / arch)
    _assert_same_weights(loaded, written)
    if arch == "lxmert":  # the masked-LM decoder stays the word embeddings, stored once
        assert (loaded.mlm_head.decoder.weight.data_ptr()
                == loaded.lxmert.embeddings.word_embeddings.weight.data_ptr())


def test_save_refuses_a_model_no_checkpoint_holds(tmp_path):
    from model.tasks import AnswerModel

    encoder = model.LxmertModel(LxmertConfig.tiny())
    with pytest.raises(model.CheckpointError, match="AnswerModel is not a model our format"):
        model.save(AnswerModel(encoder, 3), tmp_path / "task")
    assert not (tmp_path / "task").exists()


# --- a fine-tuned run in Python: the answers of `pipeline predict` --------------------------------


def _run(task: str, world, tmp_path: Path, root: Path, shards: Path, val: str) -> Path:
    run = tmp_path / task.rstrip("+")
    sets = [f"data.root={root}", "data.train=[train]", f"data.val={val}", f"data.shards=[{shards}]",
            "data.batch_size=4", "run.max_steps=3"]
    assert finetune(task, run, sets + TINY) == 0
    return run


def _predicted(task: str, run: Path, subset: str, out: Path) -> Path:
    assert main(["predict", task, "--run", str(run), "--subset", subset, "--out", str(out)]) == 0
    return out


def _regions(sample: Sample) -> RegionFeatures:
    """Not a Sample: what the extractor returns for an image (pixel boxes, the image size)."""
    a = sample.arrays
    return RegionFeatures(
        image_height=sample.meta["height"], image_width=sample.meta["width"],
        boxes_xyxy_abs=a["boxes"], object_ids=a["object_ids"].astype(np.int64),
        object_conf=a["object_conf"], attr_ids=a["attr_ids"].astype(np.int64),
        attr_conf=a["attr_conf"], features=a["features"])


def test_a_vqa_run_answers_in_python_what_pipeline_predict_writes(pretrain_world, tiny_vqa_run,
                                                                   tmp_path):
    run = tiny_vqa_run
    written = json.loads(_predicted("vqa", run, "val2014", tmp_path / "vqa.json").read_text())
    vqa = load_predictor(run)
    store = FeatureStore(pretrain_world.shards[0])
    questions = subset_examples("vqa", pretrain_world.world / "vqa", "val2014")
    assert len(questions) == len(written) > 5
    vocab = set(AnswerVocab.load(run / "answers.json").answers)
    for question, row in zip(questions, written):
        answers = vqa(question.sentence, store[question.images[0]], top_k=3)
        assert int(question.id) == row["question_id"]
        assert answers[0].answer == row["answer"]
        scores = [a.score for a in answers]
        assert len(answers) == 3 and 1 >= scores[0] >= scores[1] >= scores[2] > 0
        assert {a.answer for a in answers} <= vocab
    # the extractor's regions (boxes in pixels, the image size) give the same answers
    first, sample = questions[0], store[questions[0].images[0]]
    assert vqa(first.sentence, _regions(sample)) == vqa(first.sentence, sample)
    with pytest.raises(ValueError, match="no boxes_xyxy_abs or boxes"):
        vqa(first.sentence, object())
    cut = dataclasses.replace(_regions(sample), boxes_xyxy_abs=sample.arrays["boxes"][1:])
    with pytest.raises(ValueError, match=r"features must be \(N, D\) and boxes \(N, 4\)"):
        vqa(first.sentence, cut)


def test_an_nlvr2_run_judges_each_pair_as_pipeline_predict(pretrain_world, tmp_path):
    run = tmp_path / "nlvr2"
    assert finetune("nlvr2", run, nlvr2_sets(pretrain_world) + TINY, "run.max_steps=3") == 0
    rows = list(csv.reader(_predicted("nlvr2", run, "dev", tmp_path / "dev.csv").open()))
    nlvr2 = load_predictor(run)
    store = FeatureStore(pretrain_world.nlvr2)
    examples = subset_examples("nlvr2", pretrain_world.world / "nlvr2", "dev")
    assert [e.id for e in examples] == [r[0] for r in rows]
    for example, (_, label) in zip(examples, rows):
        verdicts = nlvr2(example.sentence, [store[k] for k in example.images])
        assert verdicts[0].answer == label
        assert {v.answer for v in verdicts} == {"True", "False"}
        assert verdicts[0].score + verdicts[1].score == pytest.approx(1.0)
    with pytest.raises(ValueError, match="pair of images"):
        nlvr2(examples[0].sentence, [store[examples[0].images[0]]])


def test_a_refcoco_run_ranks_the_regions_its_prediction_chose(pretrain_world, tmp_path):
    refs = pretrain_world.world / "refcoco+"
    run = _run("refcoco+", pretrain_world, tmp_path, refs, pretrain_world.shards[0], "val")
    written = json.loads(_predicted("refcoco+", run, "val", tmp_path / "ref.json").read_text())
    refer = load_predictor(run)
    store = FeatureStore(pretrain_world.shards[0])
    expressions = subset_examples("refcoco+", refs, "val")
    assert [int(e.id) for e in expressions] == [row["sent_id"] for row in written]
    for expression, row in zip(expressions, written):
        sample = store[expression.images[0]]
        ranked = refer(expression.sentence, sample)
        assert list(ranked[0].box_xyxy) == row["box"]
        regions = min(sample.num_boxes, refer.run.config.data.max_boxes)
        assert sorted(r.region for r in ranked) == list(range(regions))
        assert [r.score for r in ranked] == sorted((r.score for r in ranked), reverse=True)


def test_a_flickr30k_run_scores_the_matrix_pipeline_predict_writes(pretrain_world, flickr_shards,
                                                                   tmp_path):
    karpathy = pretrain_world.world / "flickr30k"
    run = _run("flickr30k", pretrain_world, tmp_path, karpathy, flickr_shards, "val")
    written = read_retrieval_predictions(_predicted("flickr30k", run, "test",
                                                    tmp_path / "test.npz"))
    retrieve = load_predictor(run)
    captions = subset_examples("flickr30k", karpathy, "test")
    by_imgid = {c.imgid: c.images[0] for c in captions}
    by_sentid = {int(c.id): c.sentence for c in captions}
    store = FeatureStore(flickr_shards)
    scores = retrieve([by_sentid[s] for s in written.sentids.tolist()],
                      [store[by_imgid[i]] for i in written.imgids.tolist()])
    assert scores.shape == written.scores.shape and scores.dtype == np.float32
    np.testing.assert_allclose(scores, written.scores, rtol=1e-5, atol=1e-6)


def test_a_vqa_run_shows_where_the_question_looks(pretrain_world, tiny_vqa_run):
    """QuestionAttention against the run's LXMERT encoder fed by hand: the question tokenized by
    the run's tokenizer, the sample's features and its boxes divided by the image's size."""
    vqa = load_predictor(tiny_vqa_run)
    store = FeatureStore(pretrain_world.shards[0])
    sample = store[next(store.keys())]
    question = "what colour is the ball?"
    seen = vqa.attention(question, sample)

    tokenizer = vqa.run.objective.tokenizer
    ids = tokenizer(question)["input_ids"]
    assert seen.words == tokenizer.convert_ids_to_tokens(ids)
    assert seen.words[0] == "[CLS]" and seen.words[-1] == "[SEP]" and "ball" in seen.words
    n = min(len(sample.arrays["boxes"]), vqa.run.config.data.max_boxes)
    size = np.array([sample.meta["width"], sample.meta["height"]] * 2, np.float32)
    features = torch.from_numpy(sample.arrays["features"][:n].astype(np.float32))[None]
    with torch.no_grad():
        out = vqa.run.model.encoder(
            input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids)),
            token_type_ids=torch.zeros(1, len(ids), dtype=torch.long), features=features,
            boxes=torch.from_numpy(sample.arrays["boxes"][:n] / size)[None],
            region_mask=torch.ones(1, n), output_attentions=True)
    expected = torch.stack(out.attentions.cross_text_to_visual, dim=1)[0]  # (L, heads, T, N)
    assert seen.layers == tuple(f"x{i + 1}" for i in range(len(expected)))
    assert seen.maps.shape == expected.shape
    torch.testing.assert_close(seen.maps, expected, rtol=1e-5, atol=1e-6)
    # LXMERT's cross attention reads the regions only: each word's row sums to 1
    torch.testing.assert_close(seen.maps.sum(-1), torch.ones(expected.shape[:-1]))
    np.testing.assert_allclose(seen.per_region(), expected[-1].mean(dim=(0, 1)).numpy(),
                               rtol=1e-6)
