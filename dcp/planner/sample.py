"""The unit the planner schedules: one training sample's id, tokens and attention work.

It lives in the planner, the lowest layer that needs it: `dcp.data` (which plans ahead) builds
samples and hands them down, and the planner imports nothing from `dcp.data`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    """One training sample as the planner sees it."""

    id: int
    tokens: int
    attn_pairs: int
    frames: int = 1
    """Latent frames of a video sample (1 for text and images); tokens = frames * tokens per frame."""
