"""Naming the typical mistake a wrong answer shows: the one that explains every answer best, else this case's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
