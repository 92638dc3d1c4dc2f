"""The four architectures' pretraining parts, by name: a plain table, no registry."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from model.lxmert import LxmertConfig, LxmertForPreTraining
from model.vilbert import VilBertConfig
from model.vilbert_pretraining import VilBertForPreTraining
from model.visualbert import VisualBertConfig
from model.visualbert_pretraining import VisualBertForPreTraining
from model.vlbert import VlBertConfig
from model.vlbert_pretraining import VlBertForPreTraining
from pipeline.pretrain.objectives.base import Objective
from pipeline.pretrain.objectives.lxmert import LxmertObjective, LxmertObjectiveConfig
from pipeline.pretrain.objectives.vilbert import VilBertObjective, VilBertObjectiveConfig
from pipeline.pretrain.objectives.visualbert import VisualBertObjective, VisualBertObjectiveConfig
from pipeline.pretrain.objectives.vlbert import VlBertObjective, VlBertObjectiveConfig


@dataclass(frozen=True)
class Arch:
    """model_config / model: the architecture's config and pretraining model; objective_config /
    objective: its objectives; encoder: the attribute of the pretraining model holding the encoder
    (what a checkpoint exports for fine-tuning and `pipeline convert`)."""

    model_config: type
    model: type[nn.Module]
    objective_config: type
    objective: type[Objective]
    encoder: str


ARCHS: dict[str, Arch] = {
    "lxmert": Arch(
        LxmertConfig, LxmertForPreTraining, LxmertObjectiveConfig, LxmertObjective, "lxmert"
    ),
    "visualbert": Arch(
        VisualBertConfig, VisualBertForPreTraining, VisualBertObjectiveConfig, VisualBertObjective,
        "visualbert",
    ),
    "vlbert": Arch(
        VlBertConfig, VlBertForPreTraining, VlBertObjectiveConfig, VlBertObjective, "vlbert"
    ),
    "vilbert": Arch(
        VilBertConfig, VilBertForPreTraining, VilBertObjectiveConfig, VilBertObjective, "vilbert"
    ),
}
