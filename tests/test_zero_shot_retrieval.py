"""`pipeline evaluate flickr30k --zero-shot` (pipeline/finetune/zero_shot.py): a pretrained
model's own image-text head scores every caption-image pair of the split, with no fine-tuning;
VL-BERT, whose pretraining has no such head, and runs that are not pretraining runs are refused;
a split too small for R@k is warned of."""

from __future__ import annotations

import pytest
import torch
from test_pretrain_loop import tiny_config

from pipeline.cli import main
from pipeline.evaluate.flickr30k import read_karpathy, read_retrieval_predictions
from pipeline.finetune.examples import TaskDataError
from pipeline.finetune.zero_shot import load_pretrained_matcher
from pipeline.pretrain.job import pretrain_job
from pipeline.train.launch import run_training


@pytest.fixture(scope="module")
def flickr_shards(pretrain_world, tmp_path_factory):
    from pipeline.demo.world_setup import Extraction, extract

    out = tmp_path_factory.mktemp("flickr") / "feats"
    return extract(pretrain_world.world, "flickr30k", out, Extraction(engine="local"),
                   progress=False)


def test_a_pretrained_lxmert_scores_every_pair_with_its_matching_head(pretrain_world,
                                                                      flickr_shards, tmp_path,
                                                                      capsys):
    run = tmp_path / "lxmert"
    run_training(pretrain_job, tiny_config(pretrain_world, "lxmert", "run.max_steps=2"), run)
    karpathy = pretrain_world.world / "flickr30k" / "dataset_flickr30k.json"
    out = tmp_path / "zero_shot.npz"
    assert main(["evaluate", "flickr30k", "--zero-shot", "--run", str(run), "--shards",
                 str(flickr_shards), "--annotations", str(karpathy), "--predictions",
                 str(out), "--batch-size", "7"]) == 0
    printed = capsys.readouterr()
    assert "caption->image R@1" in printed.out
    matrix = read_retrieval_predictions(out)
    images = read_karpathy(karpathy, "test")
    # The world's test split is a few images: its R@5 and R@10 mean nothing, and it says so.
    assert len(images) <= 5
    assert (f"pipeline evaluate: warning: gallery too small for caption->image R@5, R@10: only "
            f"{len(images)} images") in printed.err

    # One pair by hand: the matching head's log-odds on that caption with that image.
    from pipeline.common.text import encode_texts, load_tokenizer
    from pipeline.finetune.data import Features
    from shards.batch import collate_regions

    matcher = load_pretrained_matcher(run)
    sentid, caption = images[0].sentences[2]
    image = images[-1]
    sample = Features.open([str(flickr_shards)])[f"flickr30k-{image.filename[:-4]}"]
    regions = collate_regions([sample], max_boxes=matcher.max_boxes)
    text = encode_texts(load_tokenizer(), [caption], matcher.max_text_length)
    with torch.no_grad():
        logits = matcher.model(**text, **regions.model_inputs()).cross_relationship_score[0]
    row = list(matrix.sentids).index(sentid)
    column = list(matrix.imgids).index(image.imgid)
    assert matrix.scores[row, column] == pytest.approx(float(logits[1] - logits[0]), abs=1e-5)


def test_vl_bert_and_fine_tuning_runs_have_no_zero_shot(pretrain_world, tmp_path):
    run = tmp_path / "vlbert"
    run_training(pretrain_job, tiny_config(pretrain_world, "vlbert", "run.max_steps=1",
                                           "data.train_splits=[train, nominival]",
                                           "data.sources=[mscoco]"), run)
    with pytest.raises(TaskDataError, match="VL-BERT, whose pretraining has no image-text head"):
        load_pretrained_matcher(run)
    with pytest.raises(TaskDataError, match="neither a `pipeline pretrain` run"):
        load_pretrained_matcher(tmp_path)
