"""What a workload is: requests, each with an arrival time, a prompt and an answer length.

The real engine reads the prompts; the simulator needs only the lengths, so a prompt
may be left out (``None``) when only its length matters, which keeps a 100,000-request
workload small.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

# A prompt is token ids, plain text, or chat messages ({"role": ..., "content": ...}).
Prompt = list[int] | str | list[dict[str, str]] | None


@dataclass(frozen=True)
class RequestSpec:
    """One request to send: who, when, what, and how long its answer should be.

    ``output_len`` is the answer length the workload intends; to get exactly that many
    tokens from an engine, use it as ``max_tokens`` with ``ignore_eos=True``.
    ``prompt_len`` is exact for token ids (and for text counted with a tokenizer), an
    estimate otherwise (see :func:`labkit.workloads.tokens.estimate_tokens`).
    ``prefix_id`` and ``prefix_len`` say that the prompt's first ``prefix_len`` tokens are
    the same as those of every request with that ``prefix_id`` (a system prompt, a shared
    history): what prefix caching saves, and what the simulator needs to know to see it.
    """

    request_id: str
    arrival_time: float  # seconds from the start of the run
    prompt_len: int
    output_len: int
    prompt: Prompt = None
    prefix_id: str | None = None
    prefix_len: int = 0

    def __post_init__(self):
        if not (math.isfinite(self.arrival_time) and self.arrival_time >= 0):
            raise ValueError(
                f"request {self.request_id!r}: arrival_time must be a finite number of "
                f"seconds >= 0, got {self.arrival_time!r}"
            )
        for name in ("prompt_len", "output_len"):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"request {self.request_id!r}: {name} must be a whole number >= 1, got {value!r}")
        if not 0 <= self.prefix_len <= self.prompt_len or (self.prefix_id is None) != (self.prefix_len == 0):
            raise ValueError(
                f"request {self.request_id!r}: a shared prefix needs both a prefix_id and a "
                f"prefix_len between 1 and prompt_len={self.prompt_len}, got prefix_id="
                f"{self.prefix_id!r} and prefix_len={self.prefix_len!r}"
            )
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], (int, np.integer)):
            if len(self.prompt) != self.prompt_len:
                raise ValueError(
                    f"request {self.request_id!r}: prompt has {len(self.prompt)} token ids "
                    f"but prompt_len is {self.prompt_len}; make them agree"
                )


@dataclass(frozen=True)
class Workload(Sequence[RequestSpec]):
    """Requests in order of arrival, with a name and the settings that made them."""

    requests: tuple[RequestSpec, ...]
    name: str = "workload"
    meta: dict = field(default_factory=dict)  # generator settings (seed, rate, ...) for the record

    def __post_init__(self):
        object.__setattr__(self, "requests", tuple(self.requests))
        if not self.requests:
            raise ValueError(f"workload {self.name!r} has no requests; give at least one")
        ids = [r.request_id for r in self.requests]
        if len(set(ids)) != len(ids):
            raise ValueError(f"workload {self.name!r} has repeated request ids; make each id unique")
        times = self.arrival_times
        if np.any(np.diff(times) < 0):
            raise ValueError(f"workload {self.name!r}: requests must be in order of arrival_time; sort them first")

    def __len__(self) -> int:
        return len(self.requests)

    def __getitem__(self, index):
        """One request, or for a slice a smaller Workload (``workload[:8]`` for a quick run)."""
        if isinstance(index, slice):
            return replace(self, requests=self.requests[index])
        return self.requests[index]

    def __iter__(self) -> Iterator[RequestSpec]:
        return iter(self.requests)

    @property
    def arrival_times(self) -> np.ndarray:
        return np.array([r.arrival_time for r in self.requests], dtype=float)

    @property
    def prompt_lens(self) -> np.ndarray:
        return np.array([r.prompt_len for r in self.requests], dtype=np.int64)

    @property
    def output_lens(self) -> np.ndarray:
        return np.array([r.output_len for r in self.requests], dtype=np.int64)

    def with_shared_prefix(self, prefix_len: int, prefix_id: str = "system") -> "Workload":
        """The same requests, each prompt led by one shared prefix of ``prefix_len`` tokens (a long system
        prompt), for the simulator: prompts become lengths only, and the prefix is declared shared."""
        requests = [
            replace(r, prompt_len=r.prompt_len + prefix_len, prompt=None, prefix_id=prefix_id, prefix_len=prefix_len)
            for r in self.requests
        ]
        return replace(self, requests=tuple(requests), meta={**self.meta, "shared_prefix_len": prefix_len})

    def with_arrival_times(self, times: Sequence[float]) -> "Workload":
        """The same requests arriving at new times (for example from :func:`arrival_times`)."""
        times = np.asarray(times, dtype=float)
        if times.shape != (len(self),):
            raise ValueError(f"got {times.size} arrival times for {len(self)} requests; give one each")
        requests = [replace(r, arrival_time=float(t)) for r, t in zip(self.requests, times)]
        return replace(self, requests=tuple(requests))
