"""Masked LM scored only where a token is masked: the model's MaskedLMHead projects onto the
vocabulary (30522 wordpieces) just the K gathered tokens, not all B * T (for a small model that
projection, its softmax and their gradients were most of the step).

An objective's make_batch passes `mlm_index` (K,) to the model (PretrainObjective.masked_tokens:
the masked tokens' flat positions, padded to a capacity with static shapes), which then returns
logits (K, V), and keeps their labels `mlm_labels` (K,), IGNORE_INDEX in the padding;
`masked_lm_terms` scores them. An index's size is its shape: no step waits for the host to count.
"""

from __future__ import annotations

import torch

from model.heads import IGNORE_INDEX, masked_lm_loss
from pipeline.train.batch import accuracy


def masked_lm_terms(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(loss, (correct, count)) of the masked LM: mean cross-entropy over the labelled entries,
    0 when there is none (still reaching the head's parameters, so that every DDP rank reduces the
    same gradients whatever its batch drew), and the argmax accuracy over them, float tensors.

    logits (K, V) at the gathered tokens, labels (K,) long, IGNORE_INDEX where not masked.
    """
    if logits.dim() != 2 or logits.shape[0] != labels.shape[0] or labels.dim() != 1:
        raise ValueError(
            f"masked-LM logits {tuple(logits.shape)} are not (K, V) for the K = "
            f"{tuple(labels.shape)} gathered labels"
        )
    # a sum over the entries divided by their count (at least 1): never a mean over nothing (NaN),
    # and in the graph even for K = 0
    return masked_lm_loss(logits, labels), accuracy(logits, labels, labels != IGNORE_INDEX)
