"""VisualBERT's pretraining and task heads against `transformers`' classes with heads: a Hugging
Face directory of each class loads strictly into our class of the same name and computes the same
logits and loss (<= 1e-5, float32, random perturbed weights, eval mode); `write_hf` gives a
directory that `from_pretrained` loads with no missing or unexpected weight, tensor for tensor.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
import transformers

from model.checkpoints.common import CheckpointError, read_hf_weights, write_safetensors
from model.checkpoints.visualbert import CLASSES, read_hf, write_hf
from model.heads import masked_lm_loss, matching_loss
from model.visualbert_tasks import soft_target_loss

TOL = 1e-5
FEAT = 16
HF_TINY = dict(
    vocab_size=120,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=40,
    visual_embedding_dim=FEAT,
)
B, T, N = 2, 6, 4


def perturbed(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    return module.eval()


def batch(seed: int, lead: tuple[int, ...] = (B,), regions: int = N) -> dict[str, torch.Tensor]:
    """Encoder inputs with padded text and regions, leading axes `lead`."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(3, T + 1, lead, generator=g)
    lens.view(-1)[0] = T
    counts = torch.randint(1, regions + 1, lead, generator=g)
    counts.view(-1)[0] = regions
    return dict(
        input_ids=torch.randint(1, 120, (*lead, T), generator=g),
        attention_mask=(torch.arange(T) < lens[..., None]).long(),
        token_type_ids=torch.randint(0, 2, (*lead, T), generator=g),
        features=torch.randn(*lead, regions, FEAT, generator=g),
        region_mask=(torch.arange(regions) < counts[..., None]).long(),
    )


def hf_inputs(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    renamed = {"features": "visual_embeds", "region_mask": "visual_attention_mask"}
    renamed |= {"visual_token_type_ids": "visual_token_type_ids"}
    return {renamed.get(k, k): v for k, v in x.items()}


def through_directory(hf: torch.nn.Module, tmp_path, drop_heads: bool = False):
    """save_pretrained -> read_hf -> our model, strictly loaded; and the notes."""
    hf.save_pretrained(tmp_path / "hf")
    hf_config = json.loads((tmp_path / "hf" / "config.json").read_text())
    notes: list[str] = []
    config, state, model = read_hf(
        hf_config, read_hf_weights(tmp_path / "hf"), drop_heads=drop_heads, notes=notes
    )
    ours = CLASSES[model](config).eval()
    ours.load_state_dict(state, strict=True)
    return ours, model, notes


def exported_loads_cleanly(ours: torch.nn.Module, hf: torch.nn.Module, tmp_path) -> None:
    """write_hf -> a directory `type(hf).from_pretrained` loads fully, equal to `hf`."""
    hf_state, hf_config = write_hf(ours.config, ours.state_dict(), type(ours).__name__)
    out = tmp_path / "back"
    out.mkdir()
    write_safetensors(out / "model.safetensors", hf_state)
    (out / "config.json").write_text(json.dumps(hf_config))
    back, info = type(hf).from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    theirs = hf.state_dict()
    assert back.state_dict().keys() == theirs.keys()
    assert all(torch.equal(back.state_dict()[k], theirs[k]) for k in theirs)


def close(a: torch.Tensor, b: torch.Tensor) -> None:
    err = (a - b).abs().max().item()
    assert err <= TOL, err


def new(cls: type, seed: int, **config) -> torch.nn.Module:
    torch.manual_seed(seed)
    return perturbed(cls(transformers.VisualBertConfig(**HF_TINY, **config)), seed)


@torch.no_grad()
def test_pretraining(tmp_path):
    hf = new(transformers.VisualBertForPreTraining, 1)
    ours, model, _ = through_directory(hf, tmp_path)
    assert model == "VisualBertForPreTraining"
    x = batch(2)
    labels = torch.full((B, T), -100)
    labels[0, 1], labels[1, 2], labels[1, 0] = 5, 17, 99
    sentence_image = torch.tensor([1, 0])
    ref = hf(
        **hf_inputs(x),
        labels=torch.cat([labels, torch.full((B, N), -100)], 1),
        sentence_image_labels=sentence_image,
    )
    out = ours(**x, boxes=None)
    close(out.lang_prediction_logits, ref.prediction_logits[:, :T])
    close(out.cross_relationship_score, ref.seq_relationship_logits)
    loss = masked_lm_loss(out.lang_prediction_logits, labels) + matching_loss(
        out.cross_relationship_score, sentence_image
    )
    close(loss, ref.loss)
    exported_loads_cleanly(ours, hf, tmp_path)


@torch.no_grad()
def test_question_answering(tmp_path):
    hf = new(transformers.VisualBertForQuestionAnswering, 3, num_labels=9)
    ours, model, _ = through_directory(hf, tmp_path)
    assert (model, ours.config.num_answers) == ("VisualBertForQuestionAnswering", 9)
    x = batch(4)
    target = torch.softmax(torch.randn(B, 9, generator=torch.Generator().manual_seed(5)), -1)
    ref = hf(**hf_inputs(x), labels=target)
    logits = ours(**x, boxes=None)
    close(F.log_softmax(logits, -1), ref.logits)  # transformers returns the log-softmax
    close(soft_target_loss(logits, target), ref.loss)
    exported_loads_cleanly(ours, hf, tmp_path)


@torch.no_grad()
def test_visual_reasoning(tmp_path):
    hf = new(transformers.VisualBertForVisualReasoning, 6)
    ours, model, _ = through_directory(hf, tmp_path)
    assert model == "VisualBertForVisualReasoning"
    x = batch(7, regions=2 * N)  # both images' regions, told apart by their segment
    x["visual_token_type_ids"] = torch.cat([torch.zeros(B, N), torch.ones(B, N)], 1).long()
    labels = torch.tensor([1, 0])
    ref = hf(**hf_inputs(x), labels=labels)
    logits = ours(**x, boxes=None)
    close(logits, ref.logits)
    close(F.cross_entropy(logits, labels), ref.loss)
    exported_loads_cleanly(ours, hf, tmp_path)


@torch.no_grad()
def test_multiple_choice(tmp_path):
    hf = new(transformers.VisualBertForMultipleChoice, 8)
    ours, model, _ = through_directory(hf, tmp_path)
    assert model == "VisualBertForMultipleChoice"
    x = batch(9, lead=(B, 3))
    labels = torch.tensor([2, 0])
    ref = hf(**hf_inputs(x), labels=labels)
    logits = ours(**x, boxes=None)
    close(logits, ref.logits)
    close(F.cross_entropy(logits, labels), ref.loss)
    exported_loads_cleanly(ours, hf, tmp_path)


@torch.no_grad()
def test_region_to_phrase_alignment(tmp_path):
    hf = new(transformers.VisualBertForRegionToPhraseAlignment, 10)
    ours, model, _ = through_directory(hf, tmp_path)
    assert model == "VisualBertForRegionToPhraseAlignment"
    x = batch(11)
    positions = torch.tensor([[1, 3, -1], [2, 0, 1]])
    g = torch.Generator().manual_seed(12)
    target = torch.rand(B, 3, N, generator=g) * x["region_mask"][:, None]
    target = target / target.sum(-1, keepdim=True)
    ref = hf(**hf_inputs(x), region_to_phrase_position=positions, labels=target)
    scores = ours(**x, boxes=None, phrase_positions=positions)
    real = x["region_mask"][:, None].bool().expand_as(scores)
    close(scores[real], ref.logits[real])
    assert (scores[~real] < -1e37).all() and (ref.logits[~real] < -1e37).all()
    close(soft_target_loss(scores, target), ref.loss)
    exported_loads_cleanly(ours, hf, tmp_path)


def test_heads_dropped_on_request_and_untied_decoder_refused(tmp_path):
    hf = new(transformers.VisualBertForQuestionAnswering, 13, num_labels=5)
    ours, model, notes = through_directory(hf, tmp_path, drop_heads=True)
    assert model == "VisualBertModel"
    assert notes == ["dropped the heads of VisualBertForQuestionAnswering: cls"]

    pre = new(transformers.VisualBertForPreTraining, 14)
    raw = dict(pre.state_dict())  # the tied aliases included, as older files hold them
    assert {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"} <= raw.keys()
    legacy = {**raw, "visual_bert.embeddings.position_ids": torch.arange(40)[None]}
    notes: list[str] = []
    assert read_hf(pre.config.to_dict(), legacy, drop_heads=False, notes=notes)[2] == (
        "VisualBertForPreTraining"
    )
    assert notes == [
        "config.json names no VisualBERT class: VisualBertForPreTraining, from the tensor names"
    ]
    raw["cls.predictions.decoder.weight"] = raw["cls.predictions.decoder.weight"] + 1
    hf_config = {**pre.config.to_dict(), "architectures": ["VisualBertForPreTraining"]}
    with pytest.raises(CheckpointError, match="decoder is not tied"):
        read_hf(hf_config, raw, drop_heads=False, notes=[])
    del raw["cls.seq_relationship.bias"]
    del raw["cls.predictions.decoder.weight"]
    with pytest.raises(CheckpointError, match=r"missing: cls\.seq_relationship\.bias"):
        read_hf(hf_config, raw, drop_heads=False, notes=[])
