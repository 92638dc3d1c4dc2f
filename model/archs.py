"""The four architectures by name: the one table that the checkpoint formats, the trainer and the
command line look them up in. A plain dict, no registry."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from model.lxmert import LxmertConfig, LxmertForPreTraining, LxmertModel
from model.vilbert import VilBertConfig, VilBertModel
from model.vilbert_beta_tasks import VilBertForBetaTasks
from model.vilbert_multitask import VilBertForMultiTask
from model.vilbert_pretraining import VilBertForPreTraining
from model.visualbert import VisualBertConfig, VisualBertModel
from model.visualbert_pretraining import VisualBertForPreTraining
from model.visualbert_tasks import (
    VisualBertForMultipleChoice,
    VisualBertForQuestionAnswering,
    VisualBertForRegionToPhraseAlignment,
    VisualBertForVisualReasoning,
)
from model.vlbert import VlBertConfig, VlBertModel
from model.vlbert_pretraining import VlBertForPreTraining
from model.vlbert_tasks import (
    VlBertForMultipleChoice,
    VlBertForQuestionAnswering,
    VlBertForReferringExpressions,
)


@dataclass(frozen=True)
class Arch:
    """config: the architecture's config dataclass. encoder: the model without heads (what
    fine-tuning wraps). pretraining: the model with its paper's pretraining heads, whose
    `encoder_attr` attribute holds the encoder. saved: the classes a checkpoint of this
    architecture may hold, the default first: LXMERT's whole pretraining model (its QA head
    transfers to VQA / GQA) or its encoder; VisualBERT's encoder, its pretraining model or one of
    its authors' task models (model/visualbert_tasks.py); ViLBERT's encoder, pretraining model,
    12-in-1 multi-task model or vilbert_beta task model (its authors' released files); VL-BERT's
    encoder, pretraining model or one of its authors' task models (model/vlbert_tasks.py)."""

    config: type
    encoder: type[nn.Module]
    pretraining: type[nn.Module]
    encoder_attr: str
    saved: tuple[type[nn.Module], ...]


ARCHS: dict[str, Arch] = {
    "lxmert": Arch(
        LxmertConfig, LxmertModel, LxmertForPreTraining, "lxmert",
        (LxmertForPreTraining, LxmertModel),
    ),
    "visualbert": Arch(
        VisualBertConfig, VisualBertModel, VisualBertForPreTraining, "visualbert",
        (
            VisualBertModel, VisualBertForPreTraining, VisualBertForQuestionAnswering,
            VisualBertForVisualReasoning, VisualBertForMultipleChoice,
            VisualBertForRegionToPhraseAlignment,
        ),
    ),
    "vlbert": Arch(
        VlBertConfig, VlBertModel, VlBertForPreTraining, "vlbert",
        (VlBertModel, VlBertForPreTraining, VlBertForQuestionAnswering,
         VlBertForReferringExpressions, VlBertForMultipleChoice),
    ),
    "vilbert": Arch(
        VilBertConfig, VilBertModel, VilBertForPreTraining, "vilbert",
        (VilBertModel, VilBertForPreTraining, VilBertForMultiTask, VilBertForBetaTasks),
    ),
}
ARCH_NAMES = tuple(ARCHS)


def saved_classes(arch: str) -> dict[str, type[nn.Module]]:
    """Class name -> class of the models a checkpoint of `arch` may hold, the default first."""
    return {cls.__name__: cls for cls in ARCHS[arch].saved}
