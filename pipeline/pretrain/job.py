"""A pretraining run's Job (pipeline/train/job.py): the architecture's pretraining model and
objective, the shards joined with the corpus for training and validation, VL-BERT's text rows;
and the check of a run's config before its workers start (`prepare_pretrain`)."""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from torch import nn

from model.archs import ARCHS
from pipeline.common.config import ConfigError, absolute_paths
from pipeline.common.devices import pick_device, set_threads
from pipeline.common.text import load_tokenizer
from pipeline.pretrain.config import PretrainConfig, config_from_dict
from pipeline.corpus.read import load_answers, load_pairs
from pipeline.pretrain.data import JoinError, PretrainStream, TextStream, ValidationStream
from pipeline.pretrain.objectives import OBJECTIVES
from pipeline.train.job import Job
from pipeline.train.config import static_shapes
from pipeline.train.loop import count_steps
from shards.reader import iter_samples, list_shards
from shards.schema import Sample
from shards.storage import as_path, sort_paths

# The config's files and directories, made absolute before the run starts.
PATHS = ("data.corpus", "data.shards", "data.tokenizer", "run.init_text", "visual.extract_config",
         "visual.weights")


def first_sample(shards: list[Path]) -> Sample:
    """The first shard's first sample: its feature size, whether the shards keep images."""
    if not shards or not shards[0].is_file():
        raise JoinError(f"{shards[0]}: no such shard" if shards else "no shards given")
    for sample in iter_samples(shards[:1]):
        return sample
    raise ValueError(f"{shards[0]}: the shard holds no sample")


def derive(
    config: PretrainConfig, *, vocab_size: int, feature_dim: int, num_answers: int
) -> PretrainConfig:
    """Fill the model fields that come from the data: vocabulary, feature size, answers."""
    changes = {"vocab_size": vocab_size, "visual_feat_dim": feature_dim}
    if config.arch == "lxmert":
        changes["num_answers"] = num_answers if config.objective.qa else None
    return replace(config, model=replace(config.model, **changes))


def prepare_pretrain(config: PretrainConfig) -> PretrainConfig:
    """`config` with its paths absolute; ConfigError names a missing one. A run on Ray workers
    also builds rank 0's training stream here, so that shards and corpus that do not join or give
    no training step fail before Ray starts (the corpus is read, the shard headers scanned twice)."""
    config = absolute_paths(config, PATHS)
    if config.run.workers > 0:
        try:
            count_steps(train_stream(config, 0, config.run.workers), config)
        except JoinError as err:
            raise ConfigError(f"data.shards and data.corpus: {err}") from err
    return config


def train_shards(config: PretrainConfig) -> list[Path]:
    """The run's shards, sorted."""
    return sort_paths(shard for source in config.data.shards for shard in list_shards(source))


def train_stream(config: PretrainConfig, rank: int, world: int) -> PretrainStream:
    """Worker `rank`'s training stream: the shards joined with the corpus training splits."""
    data = config.data
    return PretrainStream(
        train_shards(config),
        load_pairs(data.corpus, data.train_splits, data.sources or None),
        batch_size=config.micro_batch,
        rank=rank,
        world_size=world,
        seed=config.run.seed,
        shuffle_buffer=data.shuffle_buffer,
        max_boxes=data.max_boxes,
        corpus_dir=data.corpus,
        splits=data.train_splits,
    )


def pretrain_job(values: dict, rank: int, world: int) -> Job:
    """The Job of `to_dict(PretrainConfig)` for worker `rank` of `world`."""
    config = config_from_dict(values)
    set_threads(config.run.threads_per_worker, world)
    data = config.data
    tokenizer = load_tokenizer(data.tokenizer or None)
    shards = train_shards(config)
    first = first_sample(shards)
    corpus = as_path(data.corpus)
    config = derive(
        config,
        vocab_size=tokenizer.vocab_size,
        feature_dim=int(first.meta["feature_dim"]),
        num_answers=len(load_answers(corpus)),
    )
    arch = ARCHS[config.arch]
    device = pick_device(config.run.device)
    torch.manual_seed(config.run.seed)
    module = arch.pretraining(config.model)
    if config.run.init_text:
        from model.checkpoints.bert import init_text_from_bert

        report = init_text_from_bert(module, config.run.init_text)
        if rank == 0:
            print(report)
    # On the device before the corpus is read: a GPU worker's host memory never holds both the
    # weights (LXMERT's: 0.8 GB in float32) and the corpus table (9.18M pairs: 0.6 GB).
    module.to(device)
    train = train_stream(config, rank, world)
    objective = OBJECTIVES[config.arch][1](
        config.objective, tokenizer, max_text_length=data.max_text_length,
        max_boxes=data.max_boxes, static_shapes=static_shapes(config.run, device),
        float16_features=device.type == "cuda",
    )
    val = ValidationStream(
        shards,
        load_pairs(corpus, (data.val_split,), data.sources or None),
        batch_size=config.micro_batch,
        rank=rank,
        world_size=world,
        max_boxes=data.max_boxes,
        corpus_dir=corpus,
        splits=(data.val_split,),
    )
    if rank == 0:
        print(f"train: {train.report.summary()}")
        print(f"val ({data.val_split}): {val.report.summary()}")
    texts = (
        TextStream(corpus / "text.txt", batch_size=data.text_rows, rank=rank, world_size=world,
                   seed=config.run.seed)
        if data.text_rows > 0
        else None
    )

    pixels = save_detector = None
    visual = config.visual
    if visual.trainable:
        # Only here: the detector's modules import torchvision (~180 MB a worker process).
        from pipeline.extract.detector import load_front_end_detector
        from pipeline.train.end_to_end import train_detector_with

        module, pixels, save_detector = train_detector_with(
            visual, module, first, ", ".join(data.shards), device,
            partial(load_front_end_detector, visual.extract_config or None, visual.weights))

    def export(module: nn.Module) -> tuple[str, object, dict]:
        # The pretraining model is exported whole, heads included (LXMERT's QA head transfers to
        # VQA / GQA; the others' convert to their authors' layouts), where arch.saved holds it.
        module = module.model if visual.trainable else module
        part = module if type(module) in arch.saved else getattr(module, arch.encoder_attr)
        return config.arch, part.config, part.state_dict()

    return Job(
        name=f"pretrain {config.arch}",
        config=config,
        device=device,
        module=module,
        objective=objective,
        train=train,
        val=val,
        texts=texts,
        export=export,
        whole_validation=True,
        pixels=pixels,
        save_with_checkpoint=save_detector,
    )
