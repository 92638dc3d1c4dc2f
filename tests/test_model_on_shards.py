"""Every architecture with every head, on real shards: the generated world's regions (extracted by
the bundled detector, `world_shards`) and the world's own captions, VQA answers and image pairs.

For each of LXMERT, VisualBERT, VL-BERT and ViLBERT (tiny configs, 64-d detector features):
- its pretraining model: each head's output shape; one backward reaches every head and the
  encoder with finite gradients; a short overfit run on the fixed batch drives each head's loss
  down, well below what any head blind to its input could reach;
- the task models of model/tasks.py (QA, NLVR2 pair, multiple choice, region scoring,
  retrieval) on the same encoder: shapes, masking of padded regions, gradients, and the same
  overfit check.

"Blind" baselines: the lowest loss a head that ignores the encoder can reach on the batch (the
label marginal's entropy, the mean target distribution's cross-entropy, ...). A head that is not
wired to the encoder's states cannot go below them, so finishing under half of them proves the
wiring, not just a learned bias.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from model.heads import (
    feature_regression_loss,
    kl_divergence_loss,
    masked_lm_loss,
    matching_loss,
    region_class_loss,
    soft_cross_entropy,
    vqa_bce_loss,
)
from model.lxmert import LxmertConfig, LxmertForPreTraining, LxmertModel
from model.tasks import (
    AnswerModel,
    MultipleChoiceModel,
    PairModel,
    RegionScoreModel,
    RetrievalModel,
    retrieval_loss,
)
from model.vilbert import VilBertConfig, VilBertModel
from model.vilbert_pretraining import VilBertForPreTraining
from model.visualbert import VisualBertConfig, VisualBertModel
from model.visualbert_pretraining import VisualBertForPreTraining
from model.vlbert import VlBertConfig, VlBertModel
from model.vlbert_pretraining import VlBertForPreTraining
from pipeline.common.text import LXMERT_MAX_TEXT_LENGTH, encode_texts, load_tokenizer
from shards.batch import RegionBatch, collate_regions
from shards.schema import split_key
from shards.store import FeatureStore

ARCHS = ("lxmert", "visualbert", "vlbert", "vilbert")
B = 4  # images in the batch
FEATURE_DIM = 64  # the world detector's region features
NUM_OBJECTS, NUM_ATTRIBUTES, NUM_CLS_PROBS = 1600, 400, 1601
# Overfit runs: 100 AdamW steps at these peak rates; every seed tried (0, 1, 2), on shards of two
# versions of the bundled detector, ends with each head at most ~0.45 of its allowed loss.
STEPS, WARMUP = 100, 10
LR = {"lxmert": 1e-2, "visualbert": 5e-3, "vlbert": 5e-3, "vilbert": 5e-3}
# No dropout, and a wider init: BERT's std 0.02 suits width 768; at width 32 it starts attention
# logits ~50x smaller than BERT-base's (sqrt(d) std^2 H), attention is uniform, text-image
# interaction is third-order small and the pair, choice and retrieval losses sit at chance for a
# seed-dependent number of steps. 0.1 brings the logits back to BERT-base's order.
OVERFIT = {"hidden_dropout": 0.0, "attention_dropout": 0.0, "initializer_range": 0.1}


# --- the batch: world shards + world annotations --------------------------------------------------


@dataclass
class WorldBatch:
    """B COCO images of the world: their regions and texts, and the labels every head needs."""

    regions: RegionBatch
    captions: list[str]  # the first COCO caption of each image
    questions: list[str]  # the first VQA question of each image
    answer_scores: torch.Tensor  # (B, A) VQA soft scores min(1, 0.3 * annotators)
    answers: list[str]  # the A answers: every normalised answer given to those questions


_NUMBER_WORDS = {
    w: str(i)
    for i, w in enumerate(["one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                           "ten"], start=1)
}


def normalise_answer(answer: str) -> str:
    """REFERENCE §3: lowercase, no final '.', no leading article, number words as digits, gray."""
    words = answer.strip().lower().rstrip(".").split()
    if words and words[0] in ("a", "an", "the"):
        words = words[1:]
    return " ".join(_NUMBER_WORDS.get(w, w) for w in words).replace("grey", "gray")


def _json(path: Path):
    with open(path) as f:
        return json.load(f)


def load_world_batch(world: Path, shards: Path) -> WorldBatch:
    """The first B Visual Genome images (by id) that are COCO images with captions and VQA."""
    coco_of = {im["image_id"]: im["coco_id"] for im in _json(world / "vg" / "image_data.json")}
    captions, qa = defaultdict(list), defaultdict(list)
    for subset in ("train2014", "val2014"):
        doc = _json(world / "coco" / "annotations" / f"captions_{subset}.json")
        for ann in sorted(doc["annotations"], key=lambda a: a["id"]):
            captions[ann["image_id"]].append(ann["caption"])
        questions = _json(world / "vqa" / f"v2_OpenEnded_mscoco_{subset}_questions.json")
        answers = _json(world / "vqa" / f"v2_mscoco_{subset}_annotations.json")
        answers = {a["question_id"]: a["answers"] for a in answers["annotations"]}
        for q in sorted(questions["questions"], key=lambda q: q["question_id"]):
            given = [normalise_answer(a["answer"]) for a in answers[q["question_id"]]]
            qa[q["image_id"]].append((q["question"], Counter(given)))

    store = FeatureStore(shards)
    ids = {}  # vg id -> image id in the shards ("VG_100K/3")
    for key in store.keys():  # noqa: SIM118 (a FeatureStore is not iterable)
        _, image_id = split_key(key)
        ids[int(image_id.rsplit("/", 1)[1])] = image_id
    chosen = [
        vg for vg in sorted(ids) if coco_of.get(vg) and captions[coco_of[vg]] and qa[coco_of[vg]]
    ][:B]
    assert len(chosen) == B, f"the world has only {len(chosen)} captioned VQA images"
    samples = [store.get_image("folder", ids[vg]) for vg in chosen]
    store.close()

    first_qa = [qa[coco_of[vg]][0] for vg in chosen]
    answers = sorted({a for _, counts in first_qa for a in counts})
    scores = torch.zeros(B, len(answers))
    for b, (_, counts) in enumerate(first_qa):
        for answer, n in counts.items():
            scores[b, answers.index(answer)] = min(1.0, 0.3 * n)
    return WorldBatch(
        # Two padded slots past the largest image: every row has padding for the heads to mask.
        regions=collate_regions(samples, pad_to=max(s.num_boxes for s in samples) + 2),
        captions=[captions[coco_of[vg]][0] for vg in chosen],
        questions=[q for q, _ in first_qa],
        answer_scores=scores,
        answers=answers,
    )


@pytest.fixture(scope="module")
def batch(world_shards) -> WorldBatch:
    return load_world_batch(world_shards.world, world_shards.shards)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer()


def texts(tokenizer, strings: list[str]) -> dict[str, torch.Tensor]:
    return encode_texts(tokenizer, strings, LXMERT_MAX_TEXT_LENGTH)


# --- models ---------------------------------------------------------------------------------------


def encoder_config(arch: str, **changes):
    """Tiny config of `arch` with the world's 64-d features and the full BERT vocabulary."""
    base = {
        "lxmert": LxmertConfig.tiny(),
        "visualbert": VisualBertConfig.tiny(),
        "vlbert": VlBertConfig.tiny(),
        "vilbert": VilBertConfig.tiny(),
    }[arch]
    if arch == "lxmert":
        changes = dict(vocab_size=30522, num_objects=NUM_OBJECTS, num_attributes=NUM_ATTRIBUTES,
                       **changes)
    return dataclasses.replace(base, visual_feat_dim=FEATURE_DIM, **changes)


def pretraining_model(arch: str, num_answers: int, **changes) -> torch.nn.Module:
    config = encoder_config(arch, **changes)
    if arch == "lxmert":
        return LxmertForPreTraining(dataclasses.replace(config, num_answers=num_answers))
    cls = {"visualbert": VisualBertForPreTraining, "vlbert": VlBertForPreTraining,
           "vilbert": VilBertForPreTraining}[arch]
    return cls(config)


def encoder(arch: str, **changes) -> torch.nn.Module:
    cls = {"lxmert": LxmertModel, "visualbert": VisualBertModel, "vlbert": VlBertModel,
           "vilbert": VilBertModel}[arch]
    return cls(encoder_config(arch, **changes))


# --- pretraining inputs and losses ----------------------------------------------------------------


@dataclass
class PretrainingInputs:
    text: dict[str, torch.Tensor]  # captions with masked tokens; row 0 is another image's caption
    mlm_labels: torch.Tensor  # (B, T): the masked tokens' ids, -100 elsewhere
    match_labels: torch.Tensor  # (B,): 0 for the mismatched row 0, 1 for the others
    masked_regions: torch.Tensor  # (B, N) bool: real regions 0, 3, 6, ...
    question_text: dict[str, torch.Tensor]  # the VQA questions (LXMERT's QA head)


def pretraining_inputs(batch: WorldBatch, tokenizer) -> PretrainingInputs:
    captions = [batch.captions[1], *batch.captions[1:]]  # image 0 gets image 1's caption
    text = texts(tokenizer, captions)
    ids = text["input_ids"]
    lengths = text["attention_mask"].sum(1)  # [CLS] words [SEP]
    positions = torch.arange(ids.shape[1])
    # Every third word (never [CLS] or [SEP]): a fixed stand-in for the objectives' sampling.
    masked = (positions % 3 == 1) & (positions[None] < lengths[:, None] - 1)
    mlm_labels = torch.where(masked, ids, -100)
    text["input_ids"] = torch.where(masked, tokenizer.mask_token_id, ids)
    real = batch.regions.region_mask.bool()
    n = torch.arange(real.shape[1])
    return PretrainingInputs(
        text=text,
        mlm_labels=mlm_labels,
        match_labels=torch.tensor([0] + [1] * (B - 1)),
        masked_regions=real & (n % 3 == 0),
        question_text=texts(tokenizer, batch.questions),
    )


def pretraining_forward(arch: str, model, batch: WorldBatch, inputs: PretrainingInputs):
    """The pretraining model's output on the captions; masked regions zeroed (LXMERT, ViLBERT)
    or replaced by VL-BERT's learned masked feature."""
    regions = batch.regions.model_inputs()
    if arch in ("lxmert", "vilbert"):
        regions["features"] = torch.where(inputs.masked_regions[..., None], 0.0,
                                          regions["features"])
    extra = {"masked_regions": inputs.masked_regions} if arch == "vlbert" else {}
    return model(**inputs.text, **regions, **extra)


def pretraining_losses(arch: str, model, batch: WorldBatch, inputs: PretrainingInputs):
    """Each head's loss on the fixed batch: name -> scalar."""
    out = pretraining_forward(arch, model, batch, inputs)
    r = batch.regions
    weight = inputs.masked_regions.float()
    losses = {"mlm": masked_lm_loss(out.lang_prediction_logits, inputs.mlm_labels)}
    if arch != "vlbert":  # VL-BERT has no matching head (its paper dropped it)
        losses["match"] = matching_loss(out.cross_relationship_score, inputs.match_labels)
    if arch == "lxmert":
        losses["obj"] = region_class_loss(out.obj_logits, r.object_ids.clamp(min=0), weight)
        losses["attr"] = region_class_loss(out.attr_logits, r.attr_ids.clamp(min=0), weight)
        losses["feat"] = feature_regression_loss(out.feat_prediction, r.features, weight)
        qa = model(**inputs.question_text, **r.model_inputs()).question_answering_score
        losses["qa"] = vqa_bce_loss(qa, batch.answer_scores)
    if arch == "vlbert":
        losses["region_soft_ce"] = soft_cross_entropy(out.region_class_logits, r.cls_probs, weight)
    if arch == "vilbert":
        losses["region_kl"] = kl_divergence_loss(out.region_class_logits, r.cls_probs, weight)
    return out, losses


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy over the last dim, 0 log 0 = 0."""
    return -(p * p.clamp_min(1e-30).log()).sum(-1)


def _binary_cross_entropy(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    return -(p * q.clamp_min(1e-30).log() + (1 - p) * (1 - q).clamp_min(1e-30).log())


def blind_vqa_bce(scores: torch.Tensor) -> float:
    """vqa_bce_loss of the best constant logits: sigmoid = each answer's mean score."""
    return float(_binary_cross_entropy(scores, scores.mean(0)).mean(0).sum())


def vqa_bce_floor(scores: torch.Tensor) -> float:
    """vqa_bce_loss of perfect logits (sigmoid = the scores): soft scores keep some entropy."""
    return float(_binary_cross_entropy(scores, scores).mean(0).sum())


def best_constant_smooth_l1(targets: torch.Tensor) -> float:
    """The lowest mean smooth-L1 loss of one constant prediction for all rows (M, D): convex,
    solved by L-BFGS from the median."""
    c = targets.median(0).values.clone().requires_grad_(True)
    lbfgs = torch.optim.LBFGS([c], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        lbfgs.zero_grad()
        loss = F.smooth_l1_loss(c.expand_as(targets), targets)
        loss.backward()
        return loss

    lbfgs.step(closure)
    return float(F.smooth_l1_loss(c.detach().expand_as(targets), targets))


def pretraining_blind(batch: WorldBatch, inputs: PretrainingInputs) -> dict[str, float]:
    """The lowest loss of each head if its scores did not depend on the encoder's states."""
    r, masked = batch.regions, inputs.masked_regions

    def marginal_entropy(labels: torch.Tensor) -> float:
        counts = torch.bincount(labels).float()
        return float(_entropy(counts / counts.sum()))

    probs = r.cls_probs[masked]  # (M, C)
    mean_probs = probs.mean(0)
    cross = -(probs * mean_probs.clamp_min(1e-30).log()).sum(-1).mean()
    return {
        "mlm": marginal_entropy(inputs.mlm_labels[inputs.mlm_labels != -100]),
        "match": marginal_entropy(inputs.match_labels),
        "obj": marginal_entropy(r.object_ids[masked]),
        "attr": marginal_entropy(r.attr_ids[masked]),
        "feat": best_constant_smooth_l1(r.features[masked]),
        "qa": blind_vqa_bce(batch.answer_scores),
        # soft targets: the excess over the targets' own entropy is what a model can remove
        "region_soft_ce": float(cross),
        "region_kl": float(cross - _entropy(probs).mean()),
    }


# --- task inputs and losses -----------------------------------------------------------------------


@dataclass
class TaskInputs:
    captions: dict[str, torch.Tensor]  # (B, T)
    questions: dict[str, torch.Tensor]  # (B, T)
    pair_text: dict[str, torch.Tensor]  # (B, T)
    pair_regions: dict[str, torch.Tensor]  # (B, 2, N, ...)
    pair_labels: torch.Tensor  # (B,)
    choices: dict[str, torch.Tensor]  # (B, K, T)
    choice_labels: torch.Tensor  # (B,)
    target_region: torch.Tensor  # (B,)


def task_inputs(batch: WorldBatch, tokenizer) -> TaskInputs:
    regions = batch.regions.model_inputs()
    # NLVR2-style: "the sentence describes one of the two images" is True for the images'
    # own pair, False for the other pair.
    sentences = [batch.captions[0], batch.captions[0], batch.captions[2], batch.captions[2]]
    pairs = torch.tensor([[0, 1], [2, 3], [2, 3], [0, 1]])
    pair_regions = {k: v[pairs] for k, v in regions.items()}  # (B, 2, N, ...)
    # Multiple choice: image b's own caption is choice b among the B captions. Images 0 and 2
    # (1 and 3) see the same order: the text alone cannot tell the answer.
    order = [[(2 * b - k) % B for k in range(B)] for b in range(B)]
    flat = texts(tokenizer, [batch.captions[i] for row in order for i in row])
    choices = {k: v.view(B, B, -1) for k, v in flat.items()}
    # Referring expression stand-in: the caption refers to the image's largest detected region.
    boxes = batch.regions.boxes_xyxy_norm
    area = (boxes[..., 2] - boxes[..., 0]) * (boxes[..., 3] - boxes[..., 1])
    area = area.masked_fill(~batch.regions.region_mask.bool(), -1.0)
    return TaskInputs(
        captions=texts(tokenizer, batch.captions),
        questions=texts(tokenizer, batch.questions),
        pair_text=texts(tokenizer, sentences),
        pair_regions=pair_regions,
        pair_labels=torch.tensor([1, 0, 1, 0]),
        choices=choices,
        choice_labels=torch.arange(B),
        target_region=area.argmax(1),
    )


def task_models(arch: str, num_answers: int, **changes) -> torch.nn.ModuleDict:
    """The five task models around ONE encoder (shared, so one optimiser trains everything)."""
    shared = encoder(arch, **changes)
    return torch.nn.ModuleDict({
        "qa": AnswerModel(shared, num_answers),
        "pair": PairModel(shared),
        "choice": MultipleChoiceModel(shared),
        "region": RegionScoreModel(shared),
        "retrieval": RetrievalModel(shared),
    })


def task_outputs(models, batch: WorldBatch, inputs: TaskInputs) -> dict[str, torch.Tensor]:
    regions = batch.regions.model_inputs()
    return {
        "qa": models["qa"](**inputs.questions, **regions),
        "pair": models["pair"](**inputs.pair_text, **inputs.pair_regions),
        "choice": models["choice"](**inputs.choices, **regions),
        "region": models["region"](**inputs.captions, **regions),
        "retrieval": models["retrieval"].score_matrix(inputs.captions, regions),
    }


def task_losses(outputs, batch: WorldBatch, inputs: TaskInputs) -> dict[str, torch.Tensor]:
    return {
        "qa": vqa_bce_loss(outputs["qa"], batch.answer_scores),
        "pair": matching_loss(outputs["pair"], inputs.pair_labels),
        "choice": F.cross_entropy(outputs["choice"], inputs.choice_labels),
        "region": F.cross_entropy(outputs["region"], inputs.target_region),
        "retrieval": retrieval_loss(outputs["retrieval"]),
    }


def task_blind(batch: WorldBatch) -> dict[str, float]:
    real = batch.regions.region_mask.sum(1).float()
    return {
        "qa": blind_vqa_bce(batch.answer_scores),
        "pair": math.log(2),  # labels 1, 0, 1, 0
        "choice": math.log(B),  # the right choice is at every position once
        "region": float(real.log().mean()),  # uniform over each image's real regions
        "retrieval": math.log(B),
    }


# --- helpers --------------------------------------------------------------------------------------


def overfit(model, loss_fn, lr: float) -> tuple[dict[str, float], dict[str, float]]:
    """STEPS AdamW steps on the sum of the losses, BERT's schedule (linear warmup over WARMUP
    steps, then linear decay to 0) and gradient clipping at 1.0, as LXMERT trains; each loss
    before and after."""
    torch.manual_seed(0)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / WARMUP, (STEPS - s) / (STEPS - WARMUP)))
    first = None
    for _ in range(STEPS):
        losses = loss_fn()
        if first is None:
            first = {k: v.item() for k, v in losses.items()}
        optimiser.zero_grad()
        sum(losses.values()).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        schedule.step()
    with torch.no_grad():
        last = {k: v.item() for k, v in loss_fn().items()}
    return first, last


def assert_learned(first, last, blind, floors=None) -> None:
    """Each loss's excess over its floor (0, or the targets' entropy) fell below half of the
    initial one and below half of the best blind head's."""
    floors = floors or {}
    for name in first:
        floor = floors.get(name, 0.0)
        initial, final, best_blind = first[name] - floor, last[name] - floor, blind[name] - floor
        assert final < 0.5 * initial, f"{name}: {first[name]:.4f} -> {last[name]:.4f}"
        assert final < 0.5 * best_blind, (
            f"{name}: {last[name]:.4f} is not far below a blind head's {blind[name]:.4f}")


def assert_finite_grads(model, heads: dict[str, torch.nn.Module]) -> None:
    for name, p in model.named_parameters():
        if p.grad is not None:
            assert torch.isfinite(p.grad).all(), f"non-finite gradient in {name}"
    # Every weight matrix of every head learns. (Not every bias: a score shared by all choices
    # or regions cancels in their softmax, so its gradient is 0 by design.)
    for head_name, head in heads.items():
        for name, p in head.named_parameters():
            if p.dim() >= 2:
                assert p.grad is not None and p.grad.abs().sum() > 0, f"{head_name}.{name}: no grad"


# --- tests ----------------------------------------------------------------------------------------


def test_world_batch_is_real(batch: WorldBatch):
    r = batch.regions
    assert len(r) == B and r.features.shape[-1] == FEATURE_DIM
    counts = r.region_mask.sum(1)
    assert (counts >= 10).all() and r.features.shape[1] == counts.max() + 2  # padded
    assert r.cls_probs is not None and torch.allclose(
        r.cls_probs.sum(-1)[r.region_mask.bool()], torch.ones(int(counts.sum())), atol=2e-2)
    assert all(batch.captions) and all(q.endswith("?") for q in batch.questions)
    assert batch.answer_scores.shape == (B, len(batch.answers))
    assert (batch.answer_scores.max(1).values == 1.0).all()


@pytest.mark.parametrize("arch", ARCHS)
def test_pretraining_heads_shapes_and_gradients(arch, batch, tokenizer):
    torch.manual_seed(0)
    A = len(batch.answers)
    model = pretraining_model(arch, A)
    inputs = pretraining_inputs(batch, tokenizer)
    out, losses = pretraining_losses(arch, model, batch, inputs)
    T, N = inputs.text["input_ids"].shape[1], batch.regions.features.shape[1]
    assert out.lang_prediction_logits.shape == (B, T, 30522)
    heads = {"mlm": model.mlm_head}
    if arch == "lxmert":
        assert out.cross_relationship_score.shape == (B, 2)
        assert out.obj_logits.shape == (B, N, NUM_OBJECTS)
        assert out.attr_logits.shape == (B, N, NUM_ATTRIBUTES)
        assert out.feat_prediction.shape == (B, N, FEATURE_DIM)
        assert out.question_answering_score.shape == (B, A)
        heads |= {"match": model.match_head, "obj": model.obj_head, "qa": model.answer_head}
    elif arch == "visualbert":
        assert out.cross_relationship_score.shape == (B, 2)
        heads |= {"match": model.match_head}
    elif arch == "vlbert":
        assert out.region_class_logits.shape == (B, N, NUM_CLS_PROBS)
        heads |= {"region": model.region_head}
    else:
        assert out.region_class_logits.shape == (B, N, NUM_CLS_PROBS)
        assert out.cross_relationship_score.shape == (B, 2)
        assert out.visual_hidden.shape[1] == N + 1  # the global image region first
        heads |= {"region": model.region_head, "align": model.align_head}
    # The MLM decoder is the word table: tied, not a copy.
    assert model.mlm_head.decoder.weight is model.get_submodule(
        {"lxmert": "lxmert.embeddings.word_embeddings", "visualbert": "visualbert.embeddings.word",
         "vlbert": "vlbert.embeddings.token", "vilbert": "vilbert.text_embeddings.token"}[arch]
    ).weight
    assert all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    assert_finite_grads(model, heads)


@pytest.mark.parametrize("arch", ARCHS)
def test_pretraining_heads_overfit(arch, batch, tokenizer):
    torch.manual_seed(0)
    model = pretraining_model(arch, len(batch.answers), **OVERFIT)
    inputs = pretraining_inputs(batch, tokenizer)
    first, last = overfit(
        model, lambda: pretraining_losses(arch, model, batch, inputs)[1], LR[arch])
    blind = pretraining_blind(batch, inputs)
    probs = batch.regions.cls_probs[inputs.masked_regions]
    print(arch, {k: f"{first[k]:.3f} -> {last[k]:.3f} (blind {blind[k]:.3f})" for k in first})
    floors = {"region_soft_ce": float(_entropy(probs).mean()),
              "qa": vqa_bce_floor(batch.answer_scores)}
    assert_learned(first, last, blind, floors)


@pytest.mark.parametrize("arch", ARCHS)
def test_task_heads_shapes_and_gradients(arch, batch, tokenizer):
    torch.manual_seed(0)
    models = task_models(arch, len(batch.answers))
    inputs = task_inputs(batch, tokenizer)
    outputs = task_outputs(models, batch, inputs)
    N = batch.regions.features.shape[1]
    assert outputs["qa"].shape == (B, len(batch.answers))
    assert outputs["pair"].shape == (B, 2)
    assert outputs["choice"].shape == (B, B)
    assert outputs["region"].shape == (B, N)
    assert outputs["retrieval"].shape == (B, B)
    real = batch.regions.region_mask.bool()
    assert (~real).any(1).all()
    assert torch.isinf(outputs["region"][~real]).all()
    assert torch.isfinite(outputs["region"][real]).all()
    # The pair model encodes the sentence with each image: swapping the images changes the logits.
    swapped = {k: v.flip(1) for k, v in inputs.pair_regions.items()}
    assert not torch.allclose(models["pair"](**inputs.pair_text, **swapped), outputs["pair"])
    # score_matrix's diagonal is the plain per-pair score.
    models.eval()
    with torch.no_grad():
        diagonal = models["retrieval"](**inputs.captions, **batch.regions.model_inputs())
        matrix = models["retrieval"].score_matrix(inputs.captions, batch.regions.model_inputs())
    assert torch.allclose(matrix.diagonal(), diagonal, atol=1e-5)
    models.train()
    losses = task_losses(outputs, batch, inputs)
    sum(losses.values()).backward()
    assert_finite_grads(models, {name: m.head for name, m in models.items()})


@pytest.mark.parametrize("arch", ARCHS)
def test_task_heads_overfit(arch, batch, tokenizer):
    torch.manual_seed(0)
    models = task_models(arch, len(batch.answers), **OVERFIT)
    inputs = task_inputs(batch, tokenizer)
    first, last = overfit(
        models, lambda: task_losses(task_outputs(models, batch, inputs), batch, inputs), LR[arch])
    blind = task_blind(batch)
    print(arch, {k: f"{first[k]:.3f} -> {last[k]:.3f} (blind {blind[k]:.3f})" for k in first})
    assert_learned(first, last, blind, {"qa": vqa_bce_floor(batch.answer_scores)})
