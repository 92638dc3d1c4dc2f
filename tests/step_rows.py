"""Rows and tiny models for the training-step tests (test_static_shapes.py, test_step_syncs.py):
every pretraining objective and fine-tuning task on the same kind of rows, whose texts and region
counts vary (some images with more regions than max_boxes, one with none), and the tiny model
each one trains, dropout off."""

from dataclasses import replace

import numpy as np
import torch
from region_fakes import WORDS, D, fake_sample

from model.archs import ARCHS
from model.tasks import AnswerModel, PairModel
from pipeline.corpus.pairs import Pair
from pipeline.finetune.answers import AnswerVocab
from pipeline.finetune.examples import Example
from pipeline.finetune.objective import AnswerTask, PairTask
from pipeline.pretrain.objectives import OBJECTIVES

MAX_TEXT, MAX_BOXES = 32, 10
ARCH_NAMES = tuple(OBJECTIVES)
VOCAB = AnswerVocab(("yes", "no", "two", "red"))


def images(count: int, seed: int, boxes: tuple[int, int] | None = None) -> list:
    """`count` samples, each with the detector's class distribution; region counts drawn in
    [low, high) = `boxes`, or by default: image 0 none, image 1 MAX_BOXES + 3 (max_boxes keeps
    MAX_BOXES), the others 1 to MAX_BOXES - 1."""
    rng = np.random.default_rng(seed)
    counts = [int(rng.integers(*(boxes or (1, MAX_BOXES)))) for _ in range(count)]
    if boxes is None:
        counts[:2] = [0, MAX_BOXES + 3][:count]
    return [fake_sample(rng, i, n) for i, n in enumerate(counts)]


def sentence(rng: np.random.Generator, start: str) -> str:
    """`start` and 3 to 11 words: shorter than MAX_TEXT wordpieces, two of them too."""
    return f"{start} " + " ".join(rng.choice(WORDS, int(rng.integers(3, 12))))


def pretrain_rows(count: int, seed: int = 0, boxes: tuple[int, int] | None = None):
    """(pairs, samples, passages): two rows per image, every third row a question with answers,
    each image with its captions; 3 text-only passages (VL-BERT's)."""
    rng = np.random.default_rng(seed)
    samples = [s for s in images(-(-count // 2), seed, boxes) for _ in (0, 1)][:count]
    pairs = []
    for i, s in enumerate(samples):
        captions = (sentence(rng, f"image {s.key}"), sentence(rng, f"also {s.key}"))
        answers = {1: 0.6, 3: 1.0} if i % 3 == 2 else None
        pairs.append(Pair(s.key, sentence(rng, f"row {i}"), "mscoco" if answers is None else "vqa",
                          answers, captions))
    return pairs, samples, [sentence(rng, "passage") for _ in range(3)]


def objective(arch: str, tokenizer, static_shapes: bool, float16_features: bool = False,
              **config):
    """The arch's pretraining objective, QA on from epoch 0 for LXMERT."""
    config_type, objective_type = OBJECTIVES[arch]
    if arch == "lxmert":
        config = {"qa_from_epoch": 0, **config}
    return objective_type(config_type(**config), tokenizer, max_text_length=MAX_TEXT,
                          max_boxes=MAX_BOXES, static_shapes=static_shapes,
                          float16_features=float16_features)


def model_config(arch: str, tokenizer, dropout: float):
    """The arch's tiny config for our rows: the tokenizer's vocabulary, D-wide features, LXMERT's
    object classes the detector's 1601 (the fake rows' object ids), `dropout` everywhere."""
    base = ARCHS[arch].config.tiny()
    changes = dict(vocab_size=len(tokenizer), visual_feat_dim=D)
    if arch == "lxmert":
        changes.update(num_objects=1601, num_attributes=2)
    return replace(base, hidden_dropout=dropout, attention_dropout=dropout, **changes)


def pretraining_model(arch: str, tokenizer, dropout: float = 0.0) -> torch.nn.Module:
    """In eval mode: train() for a training step."""
    torch.manual_seed(0)
    return ARCHS[arch].pretraining(model_config(arch, tokenizer, dropout)).eval()


def task_rows(count: int, seed: int = 0, boxes: tuple[int, int] | None = None):
    """(VQA examples, their samples, NLVR2 examples, their sample pairs)."""
    rng = np.random.default_rng(seed)
    samples = images(count + 1, seed, boxes)
    answers = [{"yes": 3, "two": 1}, {"red": 10}, {"maybe": 2}]  # "maybe" is in no vocabulary
    vqa = [Example("vqa", str(i), (s.key,), sentence(rng, "what is"), answers[i % 3], "yes", None)
           for i, s in enumerate(samples[:count])]
    nlvr2 = [Example("nlvr2", str(i), (samples[i].key, samples[i + 1].key),
                     sentence(rng, "there is"), None, None, i % 2 == 0) for i in range(count)]
    return vqa, [(s,) for s in samples[:count]], nlvr2, list(zip(samples, samples[1:]))


def task(kind: str, tokenizer, static_shapes: bool):
    sizes = dict(max_text_length=MAX_TEXT, max_boxes=MAX_BOXES, static_shapes=static_shapes)
    if kind == "answer":
        return AnswerTask(tokenizer, VOCAB, **sizes)
    return PairTask(tokenizer, **sizes)


def task_model(arch: str, kind: str, tokenizer, dropout: float = 0.0) -> torch.nn.Module:
    """In eval mode: train() for a training step."""
    torch.manual_seed(0)
    encoder = ARCHS[arch].encoder(model_config(arch, tokenizer, dropout))
    return (AnswerModel(encoder, len(VOCAB)) if kind == "answer" else PairModel(encoder)).eval()
