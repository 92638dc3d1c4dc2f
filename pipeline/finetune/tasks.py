"""The six fine-tuning tasks side by side: each one's objective, head and training streams.

    task       examples (data.subset_examples)  objective      model (model/tasks.py)
    vqa, gqa   examples.Example                 AnswerTask     AnswerModel
    nlvr2      examples.Example (two images)    PairTask       PairModel
    vcr        vcr.ChoiceExample                ChoiceTask     MultipleChoiceModel
    refcoco+   refcoco.RefExample               RegionTask     RegionScoreModel
    flickr30k  retrieval.CaptionExample         RetrievalTask  RetrievalModel

Every task but Flickr30K trains on its examples as they are (data.TaskStream); Flickr30K's rows
draw their distractors (distractors.RetrievalStream).
"""

from __future__ import annotations

from torch import nn

from model.tasks import (
    AnswerModel,
    MultipleChoiceModel,
    PairModel,
    RegionScoreModel,
    RetrievalModel,
    TaskModel,
)
from pipeline.finetune.answers import AnswerVocab
from pipeline.finetune.data import EvalStream, Features, TaskStream
from pipeline.finetune.distractors import RetrievalStream, hard_negative_pool
from pipeline.finetune.examples import ANSWER_TASKS
from pipeline.finetune.objective import AnswerTask, PairTask, TaskRows
from pipeline.finetune.refcoco import RegionTask
from pipeline.finetune.retrieval import RetrievalTask
from pipeline.finetune.vcr import ChoiceTask

OBJECTIVES: dict[str, type[TaskRows]] = {
    "nlvr2": PairTask, "vcr": ChoiceTask, "refcoco+": RegionTask, "flickr30k": RetrievalTask,
}
HEADS: dict[str, type[TaskModel]] = {
    "nlvr2": PairModel, "vcr": MultipleChoiceModel, "refcoco+": RegionScoreModel,
    "flickr30k": RetrievalModel,
}


def one_blind_region(config) -> bool:
    """Whether a run's language-only rows may carry one zero region per image instead of every
    region zeroed, for the same outputs at the cost of the text alone. LXMERT reads the regions
    only by attending over the regions themselves (its object encoder; cross-attention from the
    words to the regions), and over N identical keys and values attention gives what it gives
    over one: the same output for any N (tests/test_finetune.py checks it). Not so for the
    single-stream models (a word's attention is shared between words and regions, so the number
    of regions weighs), for ViLBERT (its global image region), for tasks that score or name
    regions (VCR, RefCOCO+, retrieval) or for a detector trained end to end."""
    return (config.data.language_only and config.arch == "lxmert"
            and config.task in (*ANSWER_TASKS, "nlvr2") and not config.visual.trainable)


def task_objective(config, tokenizer, vocab: AnswerVocab | None, *,
                   static_shapes: bool = False, float16_features: bool = False) -> TaskRows:
    """The objective of a run's FinetuneConfig `config` (a vocabulary for VQA, GQA)."""
    task, data = config.task, config.data
    kind = dict(max_text_length=data.max_text_length, max_boxes=data.max_boxes,
                language_only=data.language_only, static_shapes=static_shapes,
                float16_features=float16_features)
    if one_blind_region(config):
        kind["one_blind_region"] = True
    if task in ANSWER_TASKS:
        return AnswerTask(tokenizer, vocab, **kind)
    return OBJECTIVES[task](tokenizer, **kind)


# ViLBERT's 12-in-1 model reads a task token after [CLS]: each task's number in its
# vilbert_tasks.yml (TASK<n> -> n; VCR's Q->A, RefCOCO+, Flickr30K retrieval).
TWELVE_IN_ONE_TASKS = {"vqa": 1, "vcr": 5, "flickr30k": 8, "refcoco+": 10, "nlvr2": 12, "gqa": 15}


def task_model(task: str, encoder: nn.Module, vocab: AnswerVocab | None) -> TaskModel:
    """`encoder` with `task`'s head (freshly initialised); an encoder with task tokens (the
    12-in-1 ViLBERT) reads `task`'s own."""
    model = AnswerModel(encoder, len(vocab)) if task in ANSWER_TASKS else HEADS[task](encoder)
    if getattr(encoder.config, "num_task_tokens", 0):
        model.task_id = TWELVE_IN_ONE_TASKS[task]
    return model


def task_streams(task: str, train: list, val: list, features: Features, *, batch_size: int,
                 rank: int, world_size: int, seed: int) -> tuple[TaskStream, TaskStream]:
    """(training stream, validation stream) of a run's examples."""
    if task != "flickr30k":
        return (TaskStream(train, features, batch_size=batch_size, rank=rank,
                           world_size=world_size, seed=seed),
                EvalStream(val, features, batch_size=batch_size, rank=rank,
                           world_size=world_size))
    streams = []
    for examples, in_order in ((train, False), (val, True)):
        pool = hard_negative_pool(sorted({e.images[0] for e in examples}), features)
        streams.append(RetrievalStream(examples, features, batch_size=batch_size, rank=rank,
                                       world_size=world_size, seed=seed, pool=pool,
                                       in_order=in_order))
    return streams[0], streams[1]
