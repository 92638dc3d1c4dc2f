"""The models' front door in Python: `model.load(path)` reads every format `pipeline convert`
reads (ours, Hugging Face's, the authors' released files with their config file) into the class
the checkpoint was saved from, weights equal to the written ones, in eval mode; `model.save`
writes our format, which loads back equal; a fine-tuned run answers in Python
(`pipeline.finetune.load_predictor`) what `pipeline predict` writes for the same inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_finetune_released import RELEASED

import model
from model.archs import ARCHS
from model.checkpoints import save_hf, save_official
from model.lxmert import LxmertConfig
from model.visualbert import VisualBertConfig

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
