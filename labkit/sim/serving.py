"""What the calibrated simulator predicts for a load sweep against ``labkit serve``, before any request is sent.

Lab 9 sweeps the request rate with ``labkit loadtest --dataset random`` and finds the highest
rate whose p99 time per output token keeps a promise. This module makes the same sweep on
the simulator's clock, so the measured answer can be set beside a predicted one:

1. :func:`quick_calibration` fits the engine's cost model in seconds, on a few short waves
   of the shapes the sweep sends (short prompts, short answers, batch 1 up to
   ``max_num_seqs``), instead of :func:`~labkit.sim.calibrate.calibrate_engine`'s minutes.
2. :func:`predict_sweep` simulates, at each rate, the very requests the load tester sends
   (:func:`~labkit.workloads.make_workload`: same lengths, same arrival times) and
   measures them with :func:`~labkit.metrics.summarize`, the code that measures a real run.
3. :func:`predicted_highest_rate` applies the rule the load tester and lab 9's checks apply
   (:func:`labkit.slo.highest_rate`) to the predictions.

The simulator times only the engine's steps. What a client measures also holds HTTP, the
tokenizer, the server's event loop and the streaming of every token, on the same cores as
the engine; and a p99 over a handful of requests is their slowest one, which a single late
step moves. On a busy 2-core CPU, three sweeps of 6 requests differed by up to a factor of
1.5 at one rate: more than the simulator's own error, which is about 10% per step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Sequence

from labkit.engine.interfaces import SchedulerPolicy
from labkit.metrics import summarize
from labkit.sim.calibrate import Calibration, calibration_from_steps, time_engine_steps
from labkit.sim.cost_model import CostModel
from labkit.sim.simulator import simulate
from labkit.slo import Promise, highest_rate
from labkit.workloads import Workload, make_workload

QUICK_PROMPT_TOKENS = 48  # median prompt of a calibration wave: a short chat message with its template
QUICK_MAX_BATCH = 16  # larger waves would take the calibration past its seconds, and a small sweep never fills them


def quick_waves(max_num_seqs: int) -> tuple[tuple[int, int], ...]:
    """(requests arriving together, median prompt tokens) for batches 1, 2, 4, ... up to ``max_num_seqs``."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be at least 1, got {max_num_seqs}")
    largest = min(max_num_seqs, QUICK_MAX_BATCH)
    batches = sorted({min(2**power, largest) for power in range(largest.bit_length() + 1)})
    return tuple((batch, QUICK_PROMPT_TOKENS) for batch in batches)


def sweep_calibration(llm, seed: int = 0) -> Calibration:
    """The quick calibration with its record: the fit, how many steps it saw and its median step error."""
    return calibration_from_steps(llm, time_engine_steps(llm, seed, quick_waves(llm.state.max_num_seqs)))


def quick_calibration(llm, seed: int = 0) -> CostModel:
    """The engine's cost model fitted on this machine in seconds, not minutes: a few short waves of the shapes the
    sweep will run (short prompts, short answers, batch 1..max_num_seqs), timed with the engine's own trace."""
    return sweep_calibration(llm, seed).cost_model


@dataclass(frozen=True)
class RatePrediction:
    """What the simulator predicts a client sees at one request rate (latencies in ms); a
    :class:`labkit.slo.RateResult` as it is."""

    rate: float  # requests per second
    p99_tpot_ms: float  # the simulator's 99th-percentile time per output token
    median_tpot_ms: float
    p99_ttft_ms: float
    completed: int  # requests finished (== num_prompts unless something could not be served)
    num_requests: int | None = None  # requests sent; None takes every request as completed

    @property
    def lost(self) -> int:
        """Requests sent but not served."""
        return 0 if self.num_requests is None else self.num_requests - self.completed


def random_load(num_prompts: int, rate: float, *, input_len: int, output_len: int, seed: int = 0) -> Workload:
    """The requests ``labkit loadtest --dataset random`` sends at ``rate``: its own workload, not a copy of it."""
    return make_workload("random", num_prompts, rate, seed=seed, input_len=input_len, output_len=output_len)


def as_the_server_sees_it(workload: Workload, tokenizer) -> Workload:
    """Each chat prompt replaced by the token ids the server makes of it (chat template included).

    The load tester sends words and counts about 1.3 tokens a word; the server wraps them in the
    model's chat template (SmolLM2's adds a system prompt), so it computes more tokens than
    ``input_len``, and prefix caching finds the template's shared start. With the real ids the
    simulator sees both.
    """
    from labkit.models.tokens import encode_prompt  # the server's own encoding; loads the model code

    requests = []
    for request in workload:
        if request.prompt is None:
            raise ValueError(f"request {request.request_id!r} has only lengths, no prompt for the server to encode")
        ids = encode_prompt(tokenizer, request.prompt)
        requests.append(replace(request, prompt=ids, prompt_len=len(ids)))
    return replace(workload, requests=tuple(requests))


def predict_sweep(
    cost: CostModel,
    rates: Iterable[float],
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    max_num_seqs: int = 8,
    max_model_len: int = 512,
    num_blocks: int = 256,
    block_size: int = 16,
    policy: str | SchedulerPolicy = "chunked",
    tokenizer=None,
) -> list[RatePrediction]:
    """Simulate the very load `labkit loadtest --dataset random` (make_workload) sends at each rate.

    The dials are the server's (``labkit serve --max-num-seqs ... --num-gpu-blocks-override ...``);
    TPOT is the client's, (finish - first token) / (answer tokens - 1), over the served requests.
    Pass the server's ``tokenizer`` to simulate the prompts it really computes (see
    :func:`as_the_server_sees_it`); without it each prompt is ``input_len`` tokens, none shared.
    """
    predictions = []
    for rate in rates:
        workload = random_load(num_prompts, rate, input_len=input_len, output_len=output_len, seed=seed)
        if tokenizer is not None:
            workload = as_the_server_sees_it(workload, tokenizer)
        longest = int(max(workload.prompt_lens + workload.output_lens))
        if longest > max_model_len:
            raise ValueError(
                f"a request of {longest} tokens (prompt and answer) is more than max_model_len={max_model_len}: "
                "the server would refuse it; shorten the load or raise max_model_len"
            )
        trace = simulate(
            workload,
            cost,
            policy,
            num_blocks=num_blocks,
            block_size=block_size,
            max_num_seqs=max_num_seqs,
            max_model_len=max_model_len,
        )
        summary = summarize(trace)
        predictions.append(
            RatePrediction(
                rate=float(rate),
                p99_tpot_ms=summary.tpot_ms.p99,
                median_tpot_ms=summary.tpot_ms.median,
                p99_ttft_ms=summary.ttft_ms.p99,
                completed=summary.num_completed,
                num_requests=summary.num_requests,
            )
        )
    return predictions


def predicted_highest_rate(predictions: Iterable[RatePrediction], promise: Promise) -> float | None:
    """The highest rate the simulator would sign: :func:`labkit.slo.highest_rate` on the predictions."""
    return highest_rate({prediction.rate: prediction for prediction in predictions}, promise)


def format_predictions(predictions: Sequence[RatePrediction], measured_p99_tpot_ms: Sequence[float] = ()) -> str:
    """One line per rate: the prediction, and the measured p99 TPOT beside it where given."""
    header = f"{'rate (req/s)':>12}{'served':>9}{'p99 TTFT':>10}{'med TPOT':>10}{'p99 TPOT':>10}"
    if measured_p99_tpot_ms:
        header += f"{'measured':>10}{'ratio':>7}"
    lines = [header, "-" * len(header)]
    for index, p in enumerate(predictions):
        served = f"{p.completed}/{p.num_requests if p.num_requests is not None else p.completed}"
        line = f"{p.rate:>12g}{served:>9}{p.p99_ttft_ms:>10.1f}{p.median_tpot_ms:>10.1f}{p.p99_tpot_ms:>10.1f}"
        if index < len(measured_p99_tpot_ms):
            measured = measured_p99_tpot_ms[index]
            line += f"{measured:>10.1f}{measured / p.p99_tpot_ms:>7.2f}"
        lines.append(line)
    return "\n".join(lines)
