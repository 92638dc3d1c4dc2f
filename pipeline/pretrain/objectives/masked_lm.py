"""Masked LM scored only where a token is masked: the model's MaskedLMHead projects onto the
vocabulary (30522 wordpieces) just the M masked tokens, not all B * T (for a small model that
projection, its softmax and their gradients were most of the step).

An objective passes `mlm_positions(labels)` to the model as `mlm_positions`, which then returns
logits (M, V) in row-major order of the masked tokens, and scores them with `masked_lm_terms`.
"""

from __future__ import annotations

import torch

from model.heads import IGNORE_INDEX, masked_lm_loss
from pipeline.train.batch import accuracy


def mlm_positions(labels: torch.Tensor) -> torch.Tensor:
    """labels (B, T) long, IGNORE_INDEX where not masked -> (B, T) bool, True where masked."""
    return labels != IGNORE_INDEX


def masked_lm_terms(
    logits: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """(loss, (correct, count)) of the masked LM: mean cross-entropy over the masked tokens (0 when
    none is), and the argmax accuracy over them.

    logits: (M, V) at mlm_positions(labels) in row-major order, or (B, T, V) over every token (a
    model called without mlm_positions); labels (B, T) long, IGNORE_INDEX where not masked.
    """
    positions = mlm_positions(labels)
    if logits.dim() == labels.dim() + 1 and logits.shape[:-1] == labels.shape:
        logits = logits[positions]  # (M, V)
    elif logits.dim() != 2 or logits.shape[0] != int(positions.sum()):
        raise ValueError(
            f"masked-LM logits {tuple(logits.shape)} are neither (M, V) for the "
            f"{int(positions.sum())} masked tokens nor (B, T, V) for labels {tuple(labels.shape)}"
        )
    target = labels[positions]  # (M,)
    loss = masked_lm_loss(logits, target)
    if target.numel() == 0:
        # Nothing masked: the loss is 0 but must still reach the head's parameters, so that every
        # DDP rank reduces the same gradients whatever its batch drew.
        loss = loss + logits.sum() * 0
    return loss, accuracy(logits, target, torch.ones_like(target, dtype=torch.bool))
