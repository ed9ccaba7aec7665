"""``speculative_config``: the dict ``LLM`` and ``simulate`` take, checked once, with vLLM's names.

vLLM's keys: ``method`` ("ngram" or "draft_model"), ``num_speculative_tokens`` (k, draft tokens per step),
``prompt_lookup_max`` / ``prompt_lookup_min`` (n-gram sizes tried, longest first), ``model`` (the draft model).
labkit's own: a learner's ``propose``, ``accept_greedy``, ``accept_sampling``, ``rollback`` (lab 8), and, for
the simulator only, ``acceptance_rate`` (the chance that each draft token is accepted). No torch here.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

from labkit.speculative.accept import accept_greedy, accept_sampling
from labkit.speculative.ngram import propose_ngram
from labkit.speculative.rollback import rollback

METHODS = ("ngram", "draft_model")
PIECES = ("propose", "accept_greedy", "accept_sampling", "rollback")  # a learner's functions plug in here (lab 8)


@dataclass(frozen=True)
class SpeculativeConfig:
    """A checked ``speculative_config``."""

    method: str
    num_speculative_tokens: int
    prompt_lookup_max: int = 4
    prompt_lookup_min: int = 1
    model: Any = None
    propose: Callable = propose_ngram
    accept_greedy: Callable = accept_greedy
    accept_sampling: Callable = accept_sampling
    rollback: Callable = rollback
    acceptance_rate: float | None = None

    @property
    def k(self) -> int:
        return self.num_speculative_tokens

    def describe(self) -> str:
        """One line for ``LLM.describe()`` and the trace's meta."""
        if self.method == "ngram":
            source = f"prompt lookup, n = {self.prompt_lookup_max}..{self.prompt_lookup_min}"
        else:
            source = f"draft model {getattr(getattr(self.model, 'config', None), 'name', self.model)!r}"
        line = f"{self.method}: {self.k} draft tokens per step ({source})"
        if self.acceptance_rate is not None:
            line += f", acceptance rate {self.acceptance_rate} (simulated)"
        return line


KEYS = {field.name for field in fields(SpeculativeConfig)}  # what a speculative_config dict may hold


def parse_speculative_config(config: dict | SpeculativeConfig | None, *, simulated: bool = False):
    """A :class:`SpeculativeConfig` from the user's dict, or None for no speculation; clear errors otherwise."""
    if config is None or isinstance(config, SpeculativeConfig):
        return config
    if not isinstance(config, dict):
        raise TypeError(f"speculative_config must be a dict such as {_EXAMPLE}, got {type(config).__name__}")
    unknown = sorted(set(config) - KEYS)
    if unknown:
        raise ValueError(f"speculative_config has unknown keys {unknown}; the keys are {sorted(KEYS)}")
    method = config.get("method")
    if method not in METHODS:
        raise ValueError(
            f"unknown speculative method {method!r}; use 'ngram' (prompt lookup) or 'draft_model' "
            f"(with 'model': a smaller model of the same vocabulary), e.g. {_EXAMPLE}"
        )
    k = config.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise ValueError(
            f"num_speculative_tokens must be an integer >= 1 (draft tokens per step), got {k!r}; "
            "to turn speculation off, pass speculative_config=None"
        )
    lookup_max, lookup_min = config.get("prompt_lookup_max", 4), config.get("prompt_lookup_min", 1)
    if not (isinstance(lookup_min, int) and isinstance(lookup_max, int) and 1 <= lookup_min <= lookup_max):
        raise ValueError(
            f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got {lookup_min!r} and {lookup_max!r}; "
            "the defaults are 1 and 4"
        )
    if method == "draft_model" and config.get("model") is None and not simulated:
        raise ValueError(
            "method 'draft_model' needs 'model': a smaller labkit model (or its name) of the same vocabulary"
        )
    rate = config.get("acceptance_rate")
    if rate is not None and not (isinstance(rate, (int, float)) and 0 <= rate <= 1):
        raise ValueError(f"acceptance_rate must be in [0, 1], got {rate!r}")
    if rate is not None and not simulated:
        raise ValueError("acceptance_rate is a simulator parameter: the real engine measures it; leave it out for LLM")
    pieces = {name: config[name] for name in PIECES if name in config}
    for name, piece in pieces.items():
        if not callable(piece):
            raise TypeError(f"speculative_config[{name!r}] must be a function, got {type(piece).__name__}")
    return SpeculativeConfig(
        method=method,
        num_speculative_tokens=k,
        prompt_lookup_max=lookup_max,
        prompt_lookup_min=lookup_min,
        model=config.get("model"),
        acceptance_rate=None if rate is None else float(rate),
        **pieces,
    )


_EXAMPLE = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
