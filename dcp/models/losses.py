"""Loss functions in the executor's convention: (sum over loss tokens, number of loss tokens).

Returning the sum, not the mean, lets the executor normalize by the *global* batch's
loss-token count, which is what makes any plan equal single-process training."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dcp.models.precision import wide

IGNORE_INDEX = -100


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy summed over tokens whose label is not IGNORE_INDEX (pads, last tokens)."""
    loss = F.cross_entropy(wide(logits), labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return loss, (labels != IGNORE_INDEX).sum()


def mse_loss(pred: torch.Tensor, target: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token mean squared error (over channels), summed over the `valid` tokens."""
    per_token = (wide(pred) - wide(target)).pow(2).mean(-1)
    return per_token[valid].sum(), valid.sum()
