"""A fine-tuning run's Job (pipeline/train/job.py): the task model, its objective and streams.

The encoder starts from `init` (any checkpoint format `pipeline convert` reads) or from scratch.
From an LXMERT pretraining checkpoint with a QA head, VQA and GQA start their answer head from it
as the official `load_lxmert_qa` does: the hidden layers are copied, and the classifier rows of
task answers found in the pretraining answer table (`init_answers`) are copied while every other
row starts at zero. The answer vocabulary is written to the run directory (answers.json) for
`pipeline predict`. `prepare_finetune` checks a run's config before its workers start.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from model.archs import ARCHS
from model.checkpoints.formats import build_model, load_checkpoint
from model.lxmert import LxmertForPreTraining
from model.tasks import AnswerModel, TaskModel
from pipeline.common.config import ConfigError, absolute_paths
from pipeline.common.devices import pick_device, set_threads
from pipeline.common.text import load_tokenizer
from pipeline.corpus.read import load_answers
from pipeline.finetune.answers import AnswerVocab, build_gqa_vocab, build_vqa_vocab, lxmert_head_rows
from pipeline.finetune.config import FinetuneConfig, config_from_dict
from pipeline.finetune.data import Features, task_examples
from pipeline.finetune.examples import ANSWER_TASKS
from pipeline.finetune.tasks import task_model, task_objective, task_streams
from pipeline.train.config import static_shapes
from pipeline.train.checkpoint import latest_checkpoint
from pipeline.train.job import Job
from pipeline.train.loop import count_steps

ANSWERS_FILE = "answers.json"
# The config's files and directories, made absolute before the run starts.
PATHS = ("init", "init_config", "init_answers", "data.root", "data.holdout", "data.shards", "data.answers",
         "visual.extract_config", "visual.weights",
         "data.tokenizer", "run.init_text")


def prepare_finetune(config: FinetuneConfig) -> FinetuneConfig:
    """`config` with its paths absolute; ConfigError names a missing one. A run on Ray workers
    also reads its examples here, so that a task without examples or a training step fails before
    Ray starts (the examples are read twice)."""
    config = absolute_paths(config, PATHS)
    latest = latest_checkpoint(Path(config.init)) if config.init else None
    if latest is not None:  # --from RUN
        print(f"--from {config.init}: its latest checkpoint, {latest / 'model'}")
        config = replace(config, init=str(latest / "model"))
    if config.run.workers > 0:
        features, train, val = task_data(config)
        stream, _ = task_streams(config.task, train, val, features, batch_size=config.micro_batch,
                                 rank=0, world_size=config.run.workers, seed=config.run.seed)
        count_steps(stream, config)
    return config


def task_data(config: FinetuneConfig) -> tuple[Features, list, list]:
    """The run's features and its training and validation examples that have them."""
    features = Features.open(config.data.shards, config.data.cache_mb)
    train, val = task_examples(config.task, config.data)
    return (features, features.keep_present(train, "training"),
            features.keep_present(val, "validation"))


def _encoder(config: FinetuneConfig, *, vocab_size: int, feature_dim: int, rank: int):
    """(encoder, its config, the pretraining QA head or None)."""
    if not config.init:
        model_config = replace(config.model, vocab_size=vocab_size, visual_feat_dim=feature_dim)
        encoder = ARCHS[config.arch].encoder(model_config)
        if config.run.init_text:
            from model.checkpoints.bert import init_text_from_bert

            report = init_text_from_bert(encoder, config.run.init_text)
            if rank == 0:
                print(report)
        return encoder, model_config, None
    if config.run.init_text:
        raise ConfigError(
            f"run.init_text={config.run.init_text} starts a text stream from BERT, but init "
            f"{config.init} already gives the whole encoder: set only one"
        )
    checkpoint = load_checkpoint(config.init, config.arch, config_file=config.init_config or None)
    if rank == 0:
        print(checkpoint.report)
    model_config = checkpoint.config
    if model_config.visual_feat_dim != feature_dim or model_config.vocab_size != vocab_size:
        raise ConfigError(
            f"{config.init}: visual_feat_dim {model_config.visual_feat_dim} and vocab_size "
            f"{model_config.vocab_size}, but the shards hold {feature_dim}-d features and the "
            f"tokenizer has {vocab_size} wordpieces (a model pretrained with a corpus's own "
            "vocabulary needs it here too: --set data.tokenizer=DIR)"
        )
    if checkpoint.report.model == "LxmertForPreTraining":
        full = LxmertForPreTraining(model_config)
        full.load_state_dict(checkpoint.state_dict)
        return full.lxmert, model_config, full.answer_head
    if checkpoint.report.heads:  # a pretraining or task model: fine-tuning takes its encoder
        return getattr(build_model(checkpoint), ARCHS[config.arch].encoder_attr), model_config, None
    model = ARCHS[config.arch].encoder(model_config)
    model.load_state_dict(checkpoint.state_dict)
    return model, model_config, None


def transfer_answer_head(model: AnswerModel, head: nn.Module, vocab: AnswerVocab,
                         pretrain_answers: Sequence[str]) -> int:
    """Start `model.head` from LXMERT's pretraining QA head (module docstring); rows copied."""
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("classifier.")}
    model.head.load_state_dict(state, strict=False)
    task_rows, pretrain_rows = lxmert_head_rows(vocab, pretrain_answers)
    with torch.no_grad():
        model.head.classifier.weight.zero_()
        model.head.classifier.bias.zero_()
        model.head.classifier.weight[task_rows] = head.classifier.weight[pretrain_rows]
        model.head.classifier.bias[task_rows] = head.classifier.bias[pretrain_rows]
    return len(task_rows)


def answer_vocab(config: FinetuneConfig, train) -> AnswerVocab:
    if config.data.answers:
        return AnswerVocab.load(config.data.answers)
    if config.task == "vqa":
        return build_vqa_vocab(train, config.data.min_answer_count)
    return build_gqa_vocab(train)


def build_task_model(config: FinetuneConfig, *, vocab: AnswerVocab | None, vocab_size: int,
                     feature_dim: int, rank: int = 0,
                     pretrain_answers: Sequence[str] | None = None) -> tuple[TaskModel, object]:
    """The task model and its encoder's config (what a checkpoint of the run records)."""
    encoder, encoder_config, qa_head = _encoder(
        config, vocab_size=vocab_size, feature_dim=feature_dim, rank=rank
    )
    model = task_model(config.task, encoder, vocab)
    if isinstance(model, AnswerModel) and qa_head is not None and pretrain_answers is not None:
        copied = transfer_answer_head(model, qa_head, vocab, pretrain_answers)
        if rank == 0:
            print(f"answer head: {copied} of {len(vocab)} answers start from the pretrained QA "
                  "head")
    return model, encoder_config


def finetune_job(values: dict, rank: int, world: int) -> Job:
    """The Job of `to_dict(FinetuneConfig)` for worker `rank` of `world`."""
    config = config_from_dict(values)
    set_threads(config.run.threads_per_worker, world)
    data = config.data
    tokenizer = load_tokenizer(data.tokenizer or None)
    features, train, val = task_data(config)
    feature_dim = int(features[train[0].images[0]].meta["feature_dim"])
    vocab = answer_vocab(config, train) if config.task in ANSWER_TASKS else None
    torch.manual_seed(config.run.seed)
    pretrain_answers = load_answers(config.init_answers).answers if config.init_answers else None
    module, encoder_config = build_task_model(
        config, vocab=vocab, vocab_size=tokenizer.vocab_size, feature_dim=feature_dim, rank=rank,
        pretrain_answers=pretrain_answers,
    )
    # A trunk trained end to end with no visual.weights starts from the init file's CNN
    # (VL-BERT's end-to-end files carry one): the run records that file as its weights.
    visual = config.visual
    if visual.trainable and not visual.weights:
        visual = replace(visual, weights=config.init)
    # The run records the encoder it trained, so `pipeline predict` rebuilds the model from it.
    config = replace(config, model=encoder_config, init="", init_answers="",
                     run=replace(config.run, init_text=""), visual=visual)
    if rank == 0:
        print(f"{config.task}: {len(train)} training, {len(val)} validation examples"
              + (f", {len(vocab)} answers" if vocab is not None else ""))
    device = pick_device(config.run.device)
    objective = task_objective(config, tokenizer, vocab,
                               static_shapes=static_shapes(config.run, device),
                               float16_features=device.type == "cuda")
    micro = config.micro_batch
    train_stream, val_stream = task_streams(config.task, train, val, features, batch_size=micro,
                                            rank=rank, world_size=world, seed=config.run.seed)

    pixels = save_detector = None
    visual = config.visual
    if visual.trainable:
        if config.task in ("nlvr2", "flickr30k"):
            raise ConfigError(f"visual.trainable: end-to-end training takes rows of one image; "
                              f"{config.task}'s rows have several (train it on frozen features)")
        # Only here: the detector's modules import torchvision (~180 MB a worker process).
        from pipeline.extract.detector import load_front_end_detector
        from pipeline.train.end_to_end import train_detector_with

        module, pixels, save_detector = train_detector_with(
            visual, module, features[train[0].images[0]], ", ".join(config.data.shards), device,
            partial(load_front_end_detector, visual.extract_config or None, visual.weights))

    def export(module: nn.Module) -> tuple[str, object, dict]:
        module = module.model if visual.trainable else module
        return config.arch, encoder_config, module.encoder.state_dict()

    return Job(
        name=f"finetune {config.task}",
        config=config,
        device=device,
        module=module,
        objective=objective,
        train=train_stream,
        val=val_stream,
        texts=None,
        export=export,
        files={} if vocab is None else {ANSWERS_FILE: vocab.to_json()},
        pixels=pixels,
        save_with_checkpoint=save_detector,
    )
