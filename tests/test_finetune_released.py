"""Fine-tuning starts from each architecture's released file as its authors wrote it (tiny
models with the world's sizes, written in their layout by our exporter): `pipeline finetune
--from FILE` (with `init_config`, the authors' config file, where the weights do not record every
size) trains a few steps on the world's shards, and the task model's encoder is the file's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from test_finetune import finetune, vqa_sets

from model.archs import ARCHS
from model.checkpoints.formats import save_official
from model.vilbert import VilBertConfig
from model.visualbert import VisualBertConfig
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


RELEASED = {  # arch -> (file name as released, the model and the config file)
    "vilbert": ("pretrained_model.bin", _vilbert),
    "visualbert": ("model_state_epoch_9.th", _visualbert),
}


@pytest.mark.parametrize("arch", list(RELEASED))
def test_finetuning_starts_from_the_released_file(arch, pretrain_world, tmp_path):
    name, make = RELEASED[arch]
    path = tmp_path / name
    config, config_file = make(path)
    torch.manual_seed(5)
    pretrained = ARCHS[arch].pretraining(config)
    save_official(path, arch, config, pretrained.state_dict())
    init = [f"init={path}", f"init_config={config_file}", f"arch={arch}"]

    settings = load_config("vqa", None, vqa_sets(pretrain_world) + init)
    model, _ = build_task_model(settings, vocab=AnswerVocab(("yes", "no")),
                                vocab_size=WORDPIECES, feature_dim=FEATURES)
    encoder = getattr(pretrained, ARCHS[arch].encoder_attr).state_dict()
    for key, tensor in encoder.items():
        assert torch.equal(model.encoder.state_dict()[key], tensor), key

    run = tmp_path / "vqa"
    assert finetune("vqa", run, vqa_sets(pretrain_world), "run.max_steps=2", *init) == 0
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert 2 in steps
