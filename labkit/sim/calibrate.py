"""Fit the cost model to this machine's real step times, save the fit, and check what it predicts.

Presets and probes give a cost model from datasheets or micro-benchmarks; a calibration
gives it from the engine itself. Three stages, each a function:

1. **Time** (:func:`time_engine_steps`): a short seeded sweep runs the real engine on waves
   of requests of several batch sizes, prompt lengths varying inside each wave as chat
   prompts do. Prompts are chunked, so the
   trace holds pure prefill steps, pure decode steps and steps that mix both, at many
   batch sizes and context lengths. :func:`step_work` reads, for every step, the tokens it
   computed and the KV context it read.
2. **Fit** (:func:`fit_cost_model`): least squares of the lesson's formula on those steps.
3. **Check** (:func:`check_prediction`): a *new* seeded workload, arriving over time, is
   served by the real engine and by the simulator with the calibrated model; the report
   puts output throughput and median TTFT/TPOT side by side with the error in percent.

How the fit works. A step takes ``max(memory, compute) + overhead + a x context`` with
``memory = (W + k x context) / bandwidth`` and ``compute = f x new tokens / rate``, where
``k`` (KV bytes per token) and ``f`` (2 x parameters) are the model's and ``W`` is the
weight bytes the engine really holds. The unknowns are ``1 / bandwidth``, ``1 / rate``,
the overhead and ``a``, the attention time per context token beyond its bytes (see
:mod:`labkit.sim.cost_model`: zero in the lesson's model, about 10 µs on a 2-core CPU,
where the engine's paged attention runs far below the memory bandwidth; without it the
simulator put decode steps of 16 long chats at half their measured time). The max makes
the formula non-linear, but it is linear once we know which steps are memory-bound: on
those the step is ``(W + k x context) / bandwidth + overhead + a x context``, on the
others ``f x tokens / rate + overhead + a x context``. So the fit alternates: guess
the split, solve a linear least-squares problem with non-negative coefficients, re-split
every step by which term the new constants make larger, and repeat until the split stops
changing. It starts from every split "compute-bound from n tokens on" and keeps the
best, so it cannot get stuck in a poor split. Residuals are divided by the measured time
(relative least squares), so the many short decode steps, which set TPOT and throughput,
weigh as much as the few long prefill steps; steps more than four median deviations
off (another process took the CPU) are dropped and the fit redone once.

Why not simpler? A sum ``bytes / bandwidth + flops / rate + overhead`` is linear and easy
to fit, but its constants mean something else than the max formula's, so handing them to
the simulator understates every step near the crossover. And ``W`` is counted (parameters
times bytes per parameter), not fitted: as a free constant it trades off against the
overhead, since both only shift the memory-bound steps, and the fit could not tell them apart.

When no step is memory-bound. On a CPU the arithmetic is slow next to the memory: even a
batch-1 decode takes several times longer than reading the weights, so the timed steps
may say nothing about the bandwidth, and the fit can put its coefficient at zero. Then
:func:`calibrate_engine` measures the bandwidth with a copy probe, holds it fixed, and
fits the rest; the saved calibration says which it did. (Where a few batch-1 steps do
come out "memory-bound", the fitted bandwidth is an effective floor on the step time,
not the memory's speed; compare it with ``labkit info``'s probe.)

The fit is saved as JSON under the labkit cache (``$LABKIT_CACHE`` or ``~/.cache/labkit``),
in ``calibration/<machine>-<model>-<dtype>.json``, and :func:`load_calibration` reads it back.
"""

from __future__ import annotations

import itertools
import json
import math
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from labkit.cache import cache_root
from labkit.metrics import Summary, summarize
from labkit.sim.cost_model import CostModel
from labkit.trace import Trace

MIN_STEPS = 8  # fewer timed steps than this cannot pin three constants and a split
OUTLIER_DEVIATIONS = 4.0  # steps this many median absolute deviations off are dropped once

# The calibration sweep: (requests arriving together, prompt tokens each). Small batches with
# long prompts and large batches with short ones cover decode at many contexts and batch sizes.
SWEEP_WAVES = ((1, 24), (1, 400), (2, 160), (4, 64), (4, 320), (8, 32), (8, 160), (16, 24), (16, 96))
SWEEP_ANSWER_TOKENS = 12  # median answer length in a wave; lengths vary so batches shrink as they finish
SWEEP_MAX_PROMPT = 640  # with the longest answer (4 x 12), inside the calibration engine's 768-token context


class NoBoundStepsError(ValueError):
    """The timed steps never hit one of the two limits, so that limit's rate cannot be fitted."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit  # "memory" or "compute"


@dataclass(frozen=True)
class StepWork:
    """What the timed steps computed: new tokens and KV context read per step, and their seconds."""

    new_tokens: np.ndarray
    context_tokens: np.ndarray
    seconds: np.ndarray

    def __post_init__(self) -> None:
        sizes = {len(self.new_tokens), len(self.context_tokens), len(self.seconds)}
        if len(sizes) != 1:
            raise ValueError(
                f"StepWork needs one new-token count, context and time per step; got lengths {sorted(sizes)}"
            )
        if np.any(self.new_tokens < 1) or np.any(self.context_tokens < 0) or not np.all(self.seconds > 0):
            raise ValueError(
                "every step must compute at least one token, read a context of 0 or more and take a positive time"
            )

    def __len__(self) -> int:
        return len(self.seconds)


def step_work(traces: Trace | Sequence[Trace]) -> StepWork:
    """Each step's new tokens, the KV context it read (tokens already computed or found cached) and its duration."""
    traces = [traces] if isinstance(traces, Trace) else list(traces)
    steps = [step for trace in traces for step in trace.steps]
    new = [sum(step.scheduled.values()) for step in steps]
    context = [step.context_tokens for step in steps]
    seconds = [step.duration for step in steps]
    return StepWork(np.array(new, dtype=np.int64), np.array(context, dtype=np.int64), np.array(seconds, dtype=float))


def _nonnegative_least_squares(matrix: np.ndarray, target: np.ndarray) -> np.ndarray:
    """argmin |matrix @ x - target| over x >= 0, for a handful of columns.

    The answer is the plain least-squares solution on some subset of the columns (the
    others at zero), so try every subset and keep the best one whose coefficients are all
    non-negative. With four columns that is fifteen small solves.
    """
    columns = matrix.shape[1]
    best, best_loss = np.zeros(columns), float(target @ target)
    for size in range(1, columns + 1):
        for chosen in itertools.combinations(range(columns), size):
            solution, *_ = np.linalg.lstsq(matrix[:, chosen], target, rcond=None)
            if np.any(solution < 0):
                continue
            x = np.zeros(columns)
            x[list(chosen)] = solution
            residual = matrix @ x - target
            loss = float(residual @ residual)
            if loss < best_loss:
                best, best_loss = x, loss
    return best


@dataclass(frozen=True)
class _Terms:
    """Per-step inputs of the formula: bytes read, FLOPs done, and KV context tokens read."""

    bytes_read: np.ndarray
    flops_done: np.ndarray
    context: np.ndarray

    def predict(self, coefficients: np.ndarray) -> np.ndarray:
        per_byte, per_flop, overhead, per_context_token = coefficients
        return (
            np.maximum(per_byte * self.bytes_read, per_flop * self.flops_done)
            + overhead
            + per_context_token * self.context
        )

    def subset(self, kept: np.ndarray) -> "_Terms":
        return _Terms(self.bytes_read[kept], self.flops_done[kept], self.context[kept])


def _fit_split(terms: _Terms, seconds: np.ndarray, compute_bound: np.ndarray, per_byte: float | None) -> np.ndarray:
    """Alternate fit and re-split from one starting split until the split holds; return the coefficients.

    With ``per_byte`` given (a probed bandwidth), it is held fixed and the rest is fitted.
    """
    weights = 1.0 / seconds
    coefficients = np.zeros(4)
    for _ in range(50):
        memory = np.where(compute_bound, 0.0, terms.bytes_read)
        compute = np.where(compute_bound, terms.flops_done, 0.0)
        if per_byte is None:
            matrix, target = np.column_stack([memory, compute, np.ones_like(seconds), terms.context]), seconds
            coefficients = _nonnegative_least_squares(matrix * weights[:, None], target * weights)
        else:
            matrix = np.column_stack([compute, np.ones_like(seconds), terms.context])
            rest = _nonnegative_least_squares(matrix * weights[:, None], (seconds - per_byte * memory) * weights)
            coefficients = np.concatenate([[per_byte], rest])
        new_split = coefficients[1] * terms.flops_done > coefficients[0] * terms.bytes_read
        if np.array_equal(new_split, compute_bound):
            break
        compute_bound = new_split
    return coefficients


def _fit_coefficients(terms: _Terms, seconds: np.ndarray, new_tokens: np.ndarray, per_byte: float | None) -> np.ndarray:
    """The best (s per byte, s per FLOP, overhead, s per context token) over every starting split."""
    best, best_loss = np.zeros(4), math.inf
    for threshold in np.unique(new_tokens).tolist() + [math.inf]:
        coefficients = _fit_split(terms, seconds, new_tokens >= threshold, per_byte)
        relative_error = terms.predict(coefficients) / seconds - 1.0
        loss = float(relative_error @ relative_error)
        if loss < best_loss:
            best, best_loss = coefficients, loss
    return best


def fit_cost_model(
    work: StepWork,
    *,
    weight_bytes: float,
    kv_bytes_per_token: float,
    flops_per_token: float,
    bandwidth: float | None = None,
) -> CostModel:
    """The cost model whose bandwidth, arithmetic rate, overhead and attention cost best explain ``work``.

    ``weight_bytes``, ``kv_bytes_per_token`` and ``flops_per_token`` are counted from the
    model (see :func:`model_sizes`); the method is in this module's docstring. Pass
    ``bandwidth`` (bytes/s, say from :func:`~labkit.sim.hardware.measure_bandwidth`) to hold
    it fixed and fit the rest: on a machine where no step is memory-bound the step times
    cannot tell the bandwidth.
    """
    if len(work) < MIN_STEPS:
        raise ValueError(
            f"only {len(work)} timed steps; the fit needs at least {MIN_STEPS} across several "
            "batch sizes and context lengths; run a longer sweep"
        )
    if len(np.unique(work.new_tokens)) < 2:
        raise NoBoundStepsError(
            f"every timed step has {int(work.new_tokens[0])} new tokens, so the compute-bound (long prompt "
            "chunks) rate cannot be told from the fixed overhead; sweep several batch sizes and prompt lengths",
            limit="compute",
        )
    context = work.context_tokens.astype(float)
    terms = _Terms(
        weight_bytes + kv_bytes_per_token * context, flops_per_token * work.new_tokens.astype(float), context
    )
    per_byte = None if bandwidth is None else 1.0 / _positive(bandwidth, "bandwidth")
    coefficients = _fit_coefficients(terms, work.seconds, work.new_tokens, per_byte)
    relative_error = terms.predict(coefficients) / work.seconds - 1.0
    deviation = np.median(np.abs(relative_error - np.median(relative_error)))
    kept = np.abs(relative_error - np.median(relative_error)) <= OUTLIER_DEVIATIONS * max(deviation, 1e-3)
    if not kept.all() and kept.sum() >= MIN_STEPS:
        coefficients = _fit_coefficients(terms.subset(kept), work.seconds[kept], work.new_tokens[kept], per_byte)
    per_byte, per_flop, overhead, per_context_token = coefficients
    for rate, limit, steps in (
        (per_flop, "compute", "compute-bound (long prompt chunks)"),
        (per_byte, "memory", "memory-bound (small batches)"),
    ):
        if rate <= 0:
            raise NoBoundStepsError(
                f"the step times show no {steps} steps, so that rate cannot be fitted; "
                "sweep more batch sizes and prompt lengths, or, if other programs were busy, "
                "rerun on an idle machine",
                limit=limit,
            )
    return CostModel(
        bandwidth=float(1.0 / per_byte),
        flops=float(1.0 / per_flop),
        weight_bytes=weight_bytes,
        overhead_s=float(overhead),
        kv_bytes_per_token=kv_bytes_per_token,
        flops_per_token=flops_per_token,
        attention_s_per_token=float(per_context_token),
    )


def _positive(value: float, name: str) -> float:
    if not value > 0:
        raise ValueError(f"{name} must be positive, got {value!r}")
    return value


def model_sizes(model) -> dict[str, float]:
    """Weight bytes, KV bytes per token and FLOPs per token of a loaded labkit model, counted."""
    return dict(
        weight_bytes=float(model.weight_bytes()),
        kv_bytes_per_token=float(model.config.kv_bytes_per_token(model.dtype)),
        flops_per_token=2.0 * model.num_parameters(),
    )


# --- the saved calibration ---------------------------------------------------------------


@dataclass
class Calibration:
    """A fitted cost model and where it was measured: machine, device, model, dtype."""

    machine: str
    device: str
    model: str
    dtype: str
    cost: dict[str, Any]  # CostModel's fields
    num_steps: int
    median_step_error_pct: float  # median |predicted - measured| / measured over the timed steps
    bandwidth_source: str = "fitted"  # or "probed": no step was memory-bound, a copy probe measured it
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S"))

    @property
    def cost_model(self) -> CostModel:
        return CostModel(**self.cost)

    def save(self, path: str | Path | None = None) -> Path:
        """Write the calibration as JSON (to :func:`calibration_path` unless ``path`` is given)."""
        path = Path(path) if path else calibration_path(self.machine, self.model, self.dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=2))
        return path


def calibration_path(machine: str, model: str, dtype: str) -> Path:
    """Where the calibration of ``model`` in ``dtype`` on ``machine`` is kept in the labkit cache."""
    name = "-".join(part.strip() for part in (machine, model, dtype))
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    return cache_root() / "calibration" / f"{safe}.json"


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration written by :meth:`Calibration.save`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no calibration at {path}; run `labkit calibrate` on this machine first")
    try:
        data = json.loads(path.read_text())
        calibration = Calibration(**data)
        calibration.cost_model  # checks the constants
    except (ValueError, TypeError) as err:
        raise ValueError(
            f"{path} is not a readable labkit calibration ({err}); run `labkit calibrate` again to rewrite it"
        ) from err
    return calibration


def machine_name() -> str:
    """A short name for this machine: its host name."""
    return platform.node() or "this-machine"


# --- timing the engine -------------------------------------------------------------------


def sweep_workloads(vocab_size: int, seed: int = 0, waves: Sequence[tuple[int, int]] = SWEEP_WAVES) -> list:
    """The calibration sweep as seeded waves of (requests, median prompt tokens); each wave arrives at once.

    Prompt and answer lengths vary inside a wave (lognormal), as in real traffic, so the
    timed steps include batches whose sequences hold very different contexts.
    """
    from labkit.workloads import LogNormal, synthetic_workload

    answers = LogNormal(SWEEP_ANSWER_TOKENS, 0.5, low=2, high=4 * SWEEP_ANSWER_TOKENS)
    return [
        synthetic_workload(
            batch,
            float("inf"),
            LogNormal(prompt_len, 0.6, low=4, high=SWEEP_MAX_PROMPT),
            answers,
            vocab_size=vocab_size,
            seed=seed * 1000 + index,
            name=f"sweep {batch}x{prompt_len}",
        )
        for index, (batch, prompt_len) in enumerate(waves)
    ]


def time_engine_steps(llm, seed: int = 0, waves: Sequence[tuple[int, int]] = SWEEP_WAVES) -> StepWork:
    """Run the calibration sweep on ``llm`` and return every step's work and time.

    The first wave runs once more before the timing, to warm the model up.
    """
    from labkit.engine import serve_workload

    workloads = sweep_workloads(llm.model.config.vocab_size, seed, waves)
    serve_workload(llm, workloads[0])  # warm-up
    return step_work([serve_workload(llm, workload) for workload in workloads])


def calibrate_engine(llm, seed: int = 0) -> Calibration:
    """Time ``llm``'s steps on this machine and fit its cost model; the result is not yet saved.

    Where no step was memory-bound (a CPU, whose matrix arithmetic is slow next to its
    memory), the bandwidth is measured by a copy probe instead, and the rest is fitted.
    """
    return calibration_from_steps(llm, time_engine_steps(llm, seed))


def calibration_from_steps(llm, work: StepWork) -> Calibration:
    """Fit ``llm``'s cost model to steps timed on it, probing the bandwidth where no step was memory-bound.

    :func:`calibrate_engine` hands it the full sweep; a shorter sweep of other waves (say, the
    shapes one load test will send) goes through the same fit.
    """
    sizes = model_sizes(llm.model)
    bandwidth_source = "fitted"
    try:
        cost = fit_cost_model(work, **sizes)
    except NoBoundStepsError as err:
        if err.limit != "memory":
            raise
        from labkit.sim.hardware import measure_bandwidth

        cost = fit_cost_model(work, **sizes, bandwidth=measure_bandwidth(device=llm.model.device))
        bandwidth_source = "probed"
    return Calibration(
        machine=machine_name(),
        device=str(llm.model.device),
        model=llm.model.config.name,
        dtype=str(llm.model.dtype).removeprefix("torch."),
        cost=asdict(cost),
        num_steps=len(work),
        median_step_error_pct=median_step_error_pct(cost, work),
        bandwidth_source=bandwidth_source,
    )


def median_step_error_pct(cost: CostModel, work: StepWork) -> float:
    """Median of |predicted - measured| / measured over the timed steps, in percent."""
    predicted = np.array([cost.pass_time(int(n), int(c)) for n, c in zip(work.new_tokens, work.context_tokens)])
    return float(np.median(np.abs(predicted / work.seconds - 1.0)) * 100)


# --- checking the prediction on a new workload ---------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """One metric, predicted by the simulator and measured on the engine."""

    name: str
    unit: str
    predicted: float
    measured: float

    @property
    def error_pct(self) -> float:
        """(predicted - measured) / measured, in percent: positive means the simulator overshoots."""
        if self.measured == 0 or not math.isfinite(self.measured):
            return math.nan
        return (self.predicted - self.measured) / self.measured * 100.0


def compare(predicted: Summary, measured: Summary) -> list[Comparison]:
    """Output throughput and median TTFT/TPOT of two runs of one workload, side by side."""
    return [
        Comparison("output throughput", "tok/s", predicted.output_throughput, measured.output_throughput),
        Comparison("median TTFT", "ms", predicted.ttft_ms.median, measured.ttft_ms.median),
        Comparison("median TPOT", "ms", predicted.tpot_ms.median, measured.tpot_ms.median),
    ]


def format_report(rows: Sequence[Comparison], title: str = "simulator vs engine") -> str:
    """The comparison as a small text table."""
    lines = [title, f"{'metric':<20}{'predicted':>12}{'measured':>12}{'error':>10}"]
    for row in rows:
        lines.append(
            f"{row.name + ' (' + row.unit + ')':<20}{row.predicted:>12.1f}{row.measured:>12.1f}{row.error_pct:>+9.1f}%"
        )
    return "\n".join(lines)


def check_workload(vocab_size: int, num_requests: int = 32, rate: float = 2.0, seed: int = 1):
    """The held-out workload: Poisson arrivals, skewed prompt and answer lengths, a seed of its own."""
    from labkit.workloads import LogNormal, synthetic_workload

    return synthetic_workload(
        num_requests,
        rate,
        LogNormal(96, 0.8, low=8, high=480),
        LogNormal(48, 0.5, low=4, high=192),
        vocab_size=vocab_size,
        seed=seed,
        name=f"check (seed {seed}, {rate:g} req/s)",
    )


def check_prediction(llm, cost: CostModel, workload) -> tuple[list[Comparison], Trace, Trace]:
    """Serve ``workload`` on ``llm`` and simulate it with ``cost`` under the same settings (``llm.config``); compare them."""
    from labkit.engine import serve_workload
    from labkit.sim.simulator import simulate

    measured = serve_workload(llm, workload)
    simulated = simulate(workload, cost, llm.policy.name, config=llm.config)
    return compare(summarize(simulated), summarize(measured)), simulated, measured
