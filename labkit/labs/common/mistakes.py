"""Naming the typical mistake a wrong answer shows: the one that explains every answer best, else this case's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def named_mistake(mistakes: Mapping[str, Sequence[Any]], answers: Sequence[Any], index: int) -> str | None:
    """The hint of the mistake whose answers (one per case, keyed by its hint) equal all of ``answers``, else of the
    first that gives the same answer in case ``index`` (the first wrong one), else None."""
    for hint, wrong in mistakes.items():
        if list(wrong) == list(answers):
            return hint
    for hint, wrong in mistakes.items():
        if wrong[index] == answers[index]:
            return hint
    return None


def tensor_mistake(have: Any, mistakes: Mapping[str, torch.Tensor], **tolerance) -> str | None:
    """The hint of the first typical mistake whose output ``have`` equals (within ``tolerance``), else None."""
    if not isinstance(have, torch.Tensor):
        return None
    for hint, wrong in mistakes.items():
        if have.shape == wrong.shape and torch.allclose(have, wrong, **tolerance):
            return hint
    return None
