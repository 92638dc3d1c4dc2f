"""Fine-tuning starts from each architecture's released file as its authors wrote it (tiny
models with the world's sizes, written in their layout by our exporter): `pipeline finetune
--from FILE` (with `init_config`, the authors' config file, where the weights do not record every
size) trains a few steps on the world's shards, and the task model's encoder is the file's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from test_finetune import finetune, vqa_sets

from model.archs import ARCHS
from model.checkpoints.formats import save_official
from model.vilbert import VilBertConfig
from model.visualbert import VisualBertConfig
from model.vlbert import VlBertConfig
from pipeline.finetune.answers import AnswerVocab
from pipeline.finetune.config import load_config
from pipeline.finetune.job import build_task_model

WORDPIECES, FEATURES = 30522, 64  # BERT's vocabulary; the world detector's feature width


def _vilbert(path: Path) -> tuple[object, str]:
    """ViLBERT's pretraining model (BertForMultiModalPreTraining's names) and the JSON config
    their repository ships for it (config/bert_base_6layer_6conect.json's keys)."""
    config = VilBertConfig(
        vocab_size=WORDPIECES, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
        visual_feat_dim=FEATURES, visual_hidden_size=24, visual_num_layers=1, visual_num_heads=2,
        visual_intermediate_size=48, bi_hidden_size=16, bi_num_heads=2,
        text_coattn_layers=(1,), visual_coattn_layers=(0,), keep_unused_q_dense=True)
    theirs = {
        "vocab_size": WORDPIECES, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 2, "intermediate_size": 64, "max_position_embeddings": 512,
        "type_vocab_size": 2, "v_feature_size": FEATURES, "v_hidden_size": 24,
        "v_num_hidden_layers": 1, "v_num_attention_heads": 2, "v_intermediate_size": 48,
        "bi_hidden_size": 16, "bi_num_attention_heads": 2, "t_biattention_id": [1],
        "v_biattention_id": [0], "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
        "initializer_range": 0.02, "v_target_size": 1601, "hidden_act": "gelu",
    }
    (path.parent / "bert_tiny_2layer_1conect.json").write_text(json.dumps(theirs))
    return config, str(path.parent / "bert_tiny_2layer_1conect.json")


def _visualbert(path: Path) -> tuple[object, str]:
    """VisualBERT's pretraining model (their `.th`); hidden 64 = one head, as their files imply."""
    config = VisualBertConfig(vocab_size=WORDPIECES, hidden_size=64, num_layers=1, num_heads=1,
                              intermediate_size=128, visual_feat_dim=FEATURES, visual_segment=0)
    return config, ""


def _vlbert(path: Path) -> tuple[object, str]:
    """VL-BERT's pretraining model in the authors' layout (no pooler, their embeddings; the
    whole image as region 0, which fine-tuning adds), read off the file's shapes alone."""
    config = VlBertConfig(vocab_size=WORDPIECES, hidden_size=64, num_layers=1, num_heads=1,
                          intermediate_size=128, visual_feat_dim=FEATURES, geometry_dim=32,
                          layout="official", geometry_box_format="cxcywh", pooler=False)
    return config, ""


RELEASED = {  # arch -> (file name as released, the model and the config file)
    "vilbert": ("pretrained_model.bin", _vilbert),
    "visualbert": ("model_state_epoch_9.th", _visualbert),
    "vlbert": ("vl-bert-base-e2e.model", _vlbert),
}


@pytest.mark.parametrize("arch", [*RELEASED, "vilbert 12-in-1"])
def test_finetuning_starts_from_the_released_file(arch, pretrain_world, tmp_path):
    twelve_in_one = arch == "vilbert 12-in-1"
    arch = arch.split()[0]
    name, make = RELEASED[arch]
    path = tmp_path / ("multi_task_model.bin" if twelve_in_one else name)
    config, config_file = make(path)
    torch.manual_seed(5)
    if twelve_in_one:  # a task token after [CLS]: VQA's is its task 1
        from model.vilbert_multitask import VilBertForMultiTask

        config = dataclasses.replace(config, num_task_tokens=20)
        pretrained = VilBertForMultiTask(config)
    else:
        pretrained = ARCHS[arch].pretraining(config)
    save_official(path, arch, config, pretrained.state_dict())
    init = [f"init={path}", f"init_config={config_file}", f"arch={arch}"]

    settings = load_config("vqa", None, vqa_sets(pretrain_world) + init)
    model, _ = build_task_model(settings, vocab=AnswerVocab(("yes", "no")),
                                vocab_size=WORDPIECES, feature_dim=FEATURES)
    encoder = getattr(pretrained, ARCHS[arch].encoder_attr).state_dict()
    for key, tensor in encoder.items():
        assert torch.equal(model.encoder.state_dict()[key], tensor), key
    assert model.task_id == (1 if twelve_in_one else None)

    run = tmp_path / "vqa"
    assert finetune("vqa", run, vqa_sets(pretrain_world), "run.max_steps=2", *init) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert 2 in steps


def test_vlberts_whole_image_region_is_added_and_its_state_left_out():
    """The authors' layout reads region 0 as the whole image: the task model adds it (the mean
    of the real regions, box [0, 0, 1, 1], never padding) and scores only the batch's regions."""
    from model.tasks import RegionScoreModel, with_whole_image
    from model.vlbert import VlBertModel

    features = torch.arange(2 * 3 * 4, dtype=torch.float32).reshape(2, 3, 4)
    boxes = torch.rand(2, 3, 4)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    out = with_whole_image(features=features, boxes=boxes, region_mask=mask, input_ids=None)
    assert torch.equal(out["features"][0, 0], features[0, :2].mean(0))
    assert torch.equal(out["features"][1, 0], features[1, 0])
    assert torch.equal(out["boxes"][:, 0], torch.tensor([[0.0, 0, 1, 1]] * 2))
    assert torch.equal(out["region_mask"][:, 0], torch.tensor([1, 1]))
    assert torch.equal(out["features"][:, 1:], features) and out["input_ids"] is None

    config = VlBertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2,
                          intermediate_size=32, visual_feat_dim=4, geometry_dim=8,
                          layout="official", geometry_box_format="cxcywh", pooler=False)
    scores = RegionScoreModel(VlBertModel(config)).eval()(
        input_ids=torch.tensor([[1, 5, 2], [1, 6, 2]]), attention_mask=torch.ones(2, 3),
        token_type_ids=None, features=features, boxes=boxes, region_mask=mask)
    assert scores.shape == (2, 3) and torch.isinf(scores[0, 2]) and torch.isfinite(scores[0, 1])
