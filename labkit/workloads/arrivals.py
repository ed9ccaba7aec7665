"""Synthetic traffic: when requests arrive, and how long their prompts and answers are.

Arrivals follow vLLM's ``bench serve``: the gaps between requests are gamma-distributed
with shape ``burstiness`` and mean ``1 / rate``. Burstiness 1 gives exponential gaps, a
Poisson process; below 1 the requests come in clumps with long silences between them
(the gaps' coefficient of variation is ``1 / sqrt(burstiness)``); ``rate=inf`` sends
everything at t=0. The first request arrives at t=0, as in vLLM.

Lengths are skewed in real chat traffic, so the usual model is a lognormal: most
answers short, a few very long. A list of lengths replays a recorded trace instead.
Everything draws from a seeded ``numpy.random.Generator``, so a seed fixes the workload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from labkit.workloads.spec import RequestSpec, Workload

Seed = int | np.random.Generator


def _check_count(num_requests: int) -> None:
    if not isinstance(num_requests, (int, np.integer)) or num_requests < 1:
        raise ValueError(f"num_requests must be a whole number >= 1, got {num_requests!r}")


def arrival_times(num_requests: int, rate: float, burstiness: float = 1.0, seed: Seed = 0) -> np.ndarray:
    """Arrival times in seconds for ``num_requests`` requests at ``rate`` requests per second on average.

    ``burstiness`` is the gamma shape of the gaps (1 = Poisson, < 1 burstier, > 1 steadier);
    ``rate=float("inf")`` puts every arrival at 0.
    """
    _check_count(num_requests)
    if not rate > 0:  # also catches NaN
        raise ValueError(f"rate must be > 0 requests per second (or inf for all at once), got {rate!r}")
    if not (burstiness > 0 and math.isfinite(burstiness)):
        raise ValueError(f"burstiness must be a finite number > 0 (1 = Poisson), got {burstiness!r}")
    if math.isinf(rate):
        return np.zeros(num_requests)
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=num_requests - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


@dataclass(frozen=True)
class LogNormal:
    """A skewed length distribution: lognormal with this median and sigma, rounded, clipped to [low, high]."""

    median: float
    sigma: float
    low: int = 1
    high: int = 4096

    def __post_init__(self):
        if not (self.median > 0 and math.isfinite(self.median)):
            raise ValueError(f"LogNormal median must be a finite number > 0, got {self.median!r}")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"LogNormal sigma must be a finite number >= 0, got {self.sigma!r}")
        if not 1 <= self.low <= self.high:
            raise ValueError(f"LogNormal bounds need 1 <= low <= high, got low={self.low}, high={self.high}")

    def sample(self, size: int, seed: Seed = 0) -> np.ndarray:
        rng = np.random.default_rng(seed)
        draws = rng.lognormal(mean=math.log(self.median), sigma=self.sigma, size=size)
        return np.clip(np.rint(draws), self.low, self.high).astype(np.int64)


Lengths = int | Sequence[int] | LogNormal


def sample_lengths(spec: Lengths, size: int, seed: Seed = 0, what: str = "lengths") -> np.ndarray:
    """``size`` lengths from ``spec``: a fixed length, a recorded list (used in order), or a LogNormal."""
    if isinstance(spec, LogNormal):
        return spec.sample(size, seed)
    if isinstance(spec, (int, np.integer)):
        values = np.full(size, spec, dtype=np.int64)
    else:
        values = np.asarray(spec)
        if values.ndim != 1 or len(values) != size or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(
                f"{what}: a recorded list must hold {size} whole numbers, one per request; "
                f"got {values.shape[0] if values.ndim else 'a scalar'} of type {values.dtype}"
            )
    if np.any(values < 1):
        raise ValueError(f"{what} must all be >= 1, found {int(values.min())}")
    return values.astype(np.int64)


def synthetic_workload(
    num_requests: int,
    rate: float,
    prompt_len: Lengths,
    output_len: Lengths,
    *,
    burstiness: float = 1.0,
    vocab_size: int | None = None,
    seed: int = 0,
    name: str = "synthetic",
) -> Workload:
    """Requests with synthetic arrivals and lengths; prompts are random token ids if ``vocab_size`` is given.

    Without ``vocab_size`` the prompts are left out (the simulator needs only lengths).
    One seed fixes everything: arrivals, both length draws and the token ids use
    independent streams spawned from it.
    """
    _check_count(num_requests)
    if vocab_size is not None and vocab_size < 1:
        raise ValueError(f"vocab_size must be >= 1 (or None to leave prompts out), got {vocab_size!r}")
    arrival_rng, prompt_rng, output_rng, token_rng = np.random.default_rng(seed).spawn(4)
    times = arrival_times(num_requests, rate, burstiness, arrival_rng)
    prompt_lens = sample_lengths(prompt_len, num_requests, prompt_rng, "prompt_len")
    output_lens = sample_lengths(output_len, num_requests, output_rng, "output_len")
    requests = []
    for i, (t, p, o) in enumerate(zip(times.tolist(), prompt_lens.tolist(), output_lens.tolist())):
        prompt = token_rng.integers(0, vocab_size, size=p).tolist() if vocab_size else None
        requests.append(RequestSpec(f"req-{i}", t, p, o, prompt))
    meta = {
        "rate": rate,
        "burstiness": burstiness,
        "seed": seed,
        "prompt_len": _describe(prompt_len),
        "output_len": _describe(output_len),
    }
    return Workload(tuple(requests), name=name, meta=meta)


def _describe(spec: Lengths) -> str:
    return repr(spec) if isinstance(spec, (int, np.integer, LogNormal)) else f"recorded list of {len(spec)}"


def replay_workload(
    arrival_times: Sequence[float],
    prompt_lens: Sequence[int],
    output_lens: Sequence[int],
    prompts: Sequence | None = None,
    name: str = "replay",
) -> Workload:
    """A recorded trace replayed as is: one arrival time, prompt length and answer length per request."""
    counts = {len(arrival_times), len(prompt_lens), len(output_lens)}
    if prompts is not None:
        counts.add(len(prompts))
    if len(counts) != 1:
        raise ValueError(f"replay_workload needs lists of one length each, got lengths {sorted(counts)}")
    order = np.argsort(np.asarray(arrival_times, dtype=float), kind="stable")
    requests = tuple(
        RequestSpec(
            f"req-{i}",
            float(arrival_times[i]),
            int(prompt_lens[i]),
            int(output_lens[i]),
            None if prompts is None else prompts[i],
        )
        for i in order.tolist()
    )
    return Workload(requests, name=name, meta={"source": "recorded lists"})
