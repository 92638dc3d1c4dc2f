"""Pretraining objectives, one module per architecture: raw (pair, image) rows -> a masked,
labelled TrainBatch -> named losses and accuracies.

OBJECTIVES maps an architecture (model/archs.py) to its objective's config and class.
"""

from __future__ import annotations

from pipeline.pretrain.objectives.lxmert import LxmertObjective, LxmertObjectiveConfig
from pipeline.pretrain.objectives.vilbert import VilBertObjective, VilBertObjectiveConfig
from pipeline.pretrain.objectives.visualbert import VisualBertObjective, VisualBertObjectiveConfig
from pipeline.pretrain.objectives.vlbert import VlBertObjective, VlBertObjectiveConfig

OBJECTIVES: dict[str, tuple[type, type]] = {
    "lxmert": (LxmertObjectiveConfig, LxmertObjective),
    "visualbert": (VisualBertObjectiveConfig, VisualBertObjective),
    "vlbert": (VlBertObjectiveConfig, VlBertObjective),
    "vilbert": (VilBertObjectiveConfig, VilBertObjective),
}
