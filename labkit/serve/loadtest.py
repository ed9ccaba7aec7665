"""Load any OpenAI-compatible server like production traffic and measure it as ``vllm bench serve`` does.

Requests come from a labkit workload (the sale, ShareGPT, or random text) and are sent at
their arrival times: Poisson at ``--request-rate``, burstier or steadier with
``--burstiness`` (gamma gaps, as vLLM), all at once with rate ``inf``, and at most
``--max-concurrency`` in flight if given. Each is streamed with the official ``openai``
client, and the client's clock stamps every token event, so TTFT, TPOT, ITL and end-to-end
latency are what a user would see, network and queue included.

The stamps go into a :class:`~labkit.trace.Trace`, the same record the engine and the
simulator write, so :func:`labkit.metrics.summarize` measures a served run exactly as it
measures a simulated one (vLLM's definitions). A request the server refused or broke off
counts as failed, never silently dropped. A sweep over rates finds the highest that keeps a
promise, with :mod:`labkit.slo`'s rule. Inside :func:`recording`, every run is also handed to the
caller: that is how lab 9's check judges exactly the loads a learner's sweep sent.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from labkit.metrics import Summary
from labkit.slo import Promise, from_summary, highest_rate
from labkit.trace import RequestRecord, Trace
from labkit.workloads import Workload


@dataclass
class Sent:
    """One request as the client saw it; times in seconds from the start of the run."""

    request_id: str
    sent_at: float
    event_times: list[float] = field(default_factory=list)  # one per streamed event with text
    done_at: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None

    def record(self, prompt_len: int) -> RequestRecord:
        """The trace's view: one time per output token (a server that sends several tokens in one
        event gets the extra ones stamped with that event's time)."""
        times = list(self.event_times)
        if times and self.completion_tokens and self.completion_tokens > len(times):
            times += [times[-1]] * (self.completion_tokens - len(times))
        failed = self.error is not None or not times
        return RequestRecord(
            self.request_id,
            self.sent_at,
            self.prompt_tokens or prompt_len,
            token_times=times,
            finish_time=None if failed else self.done_at,
            finish_reason="rejected" if failed else self.finish_reason,
        )


_recordings: list[list[tuple[Workload, Trace]]] = []
_recordings_lock = threading.Lock()


@contextlib.contextmanager
def recording() -> Iterator[list[tuple[Workload, Trace]]]:
    """Every load :func:`run_load` sends in this process while the block lasts, as (workload, trace), in order."""
    runs: list[tuple[Workload, Trace]] = []
    with _recordings_lock:
        _recordings.append(runs)
    try:
        yield runs
    finally:
        with _recordings_lock:
            _recordings.remove(runs)


async def _send(client, model: str, spec, start: float, ignore_eos: bool) -> Sent:
    messages = spec.prompt if isinstance(spec.prompt, list) else [{"role": "user", "content": str(spec.prompt)}]
    sent = Sent(spec.request_id, time.perf_counter() - start)
    try:
        stream = await client.chat.completions.create(
            model=model,
            messages=messages,
            max_tokens=int(spec.output_len),
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True} if ignore_eos else None,
        )
        async for chunk in stream:
            now = time.perf_counter() - start
            if chunk.choices:
                choice = chunk.choices[0]
                if choice.delta is not None and choice.delta.content is not None:
                    sent.event_times.append(now)
                sent.finish_reason = choice.finish_reason or sent.finish_reason
            if chunk.usage is not None:
                sent.prompt_tokens, sent.completion_tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
        sent.done_at = time.perf_counter() - start
    except Exception as err:  # any failure of one request is a result to report, not a crash of the run
        sent.error = f"{type(err).__name__}: {err}"[:500]
    return sent


async def run_load(
    base_url: str,
    workload: Workload,
    model: str,
    *,
    api_key: str = "EMPTY",
    max_concurrency: int | None = None,
    ignore_eos: bool = False,
    timeout_s: float = 600.0,
) -> tuple[Trace, list[str]]:
    """Send every request of ``workload`` at its arrival time; return the run's trace and the errors met."""
    import openai

    if max_concurrency is not None and max_concurrency < 1:
        raise ValueError(f"max_concurrency must be at least 1 (or None for no cap), got {max_concurrency}")
    gate = asyncio.Semaphore(max_concurrency) if max_concurrency else contextlib.nullcontext()
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s) as client:
        start = time.perf_counter()

        async def one(spec) -> Sent:
            await asyncio.sleep(max(0.0, spec.arrival_time - (time.perf_counter() - start)))
            async with gate:
                return await _send(client, model, spec, start, ignore_eos)

        sents = await asyncio.gather(*(one(spec) for spec in workload))
    trace = Trace(
        requests=[s.record(spec.prompt_len) for s, spec in zip(sents, workload)],
        meta={
            "url": base_url,
            "model": model,
            "workload": workload.name,
            **workload.meta,
            "max_concurrency": max_concurrency,
            "ignore_eos": ignore_eos,
        },
    )
    with _recordings_lock:
        for runs in _recordings:
            runs.append((workload, trace))
    return trace, [f"{s.request_id}: {s.error}" for s in sents if s.error]


async def server_model(base_url: str, api_key: str = "EMPTY") -> str:
    """The first model the server lists, for when none is named."""
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=30) as client:
        models = await client.models.list()
    if not models.data:
        raise ValueError(f"{base_url}/models lists no model; name one with --model")
    return models.data[0].id


def api_base(url: str) -> str:
    """``http://host:port`` or ``.../v1`` to the ``.../v1`` base the openai client wants."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"URL {url!r} needs a scheme: http://host:port (or https://)")
    return url if url.endswith("/v1") else url + "/v1"


def best_rate(summaries: Mapping[float, Summary], promise: Promise) -> float | None:
    """The highest rate of a sweep that keeps the promise (:func:`labkit.slo.highest_rate`)."""
    return highest_rate({rate: from_summary(summary) for rate, summary in summaries.items()}, promise)


def format_bench(summary: Summary, max_concurrency: int | None = None, errors: Sequence[str] = ()) -> str:
    """The result block ``vllm bench serve`` prints, from a labkit summary (latencies in ms)."""

    def row(label: str, value) -> str:
        text = (
            "-"
            if value is None or (isinstance(value, float) and math.isnan(value))
            else (f"{value:.2f}" if isinstance(value, float) else str(value))
        )
        return f"{label:<40}{text:<10}"

    failed = summary.num_requests - summary.num_completed
    lines = [
        "{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="),
        row("Successful requests:", summary.num_completed),
        row("Failed requests:", failed),
    ]
    if max_concurrency:
        lines.append(row("Maximum request concurrency:", max_concurrency))
    lines += [
        row("Benchmark duration (s):", summary.duration_s),
        row("Total input tokens:", summary.total_input_tokens),
        row("Total generated tokens:", summary.total_output_tokens),
        row("Request throughput (req/s):", summary.request_throughput),
    ]
    if summary.slo is not None:
        lines.append(row("Request goodput (req/s):", summary.goodput))
    lines += [
        row("Output token throughput (tok/s):", summary.output_throughput),
        row("Total Token throughput (tok/s):", summary.total_token_throughput),
    ]
    for key, title, label in (
        ("ttft", "Time to First Token", "TTFT"),
        ("tpot", "Time per Output Token (excl. 1st token)", "TPOT"),
        ("itl", "Inter-token Latency", "ITL"),
        ("e2el", "End-to-end Latency", "E2EL"),
    ):
        dist = summary.distributions()[key]
        lines.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        lines += [
            row(f"Mean {label} (ms):", dist.mean),
            row(f"Median {label} (ms):", dist.median),
            row(f"P99 {label} (ms):", dist.p99),
        ]
    lines.append("=" * 50)
    lines += [f"failed: {error}" for error in list(errors)[:5]]
    return "\n".join(lines)


def format_sweep(summaries: dict[float, Summary], promise: Promise | None) -> str:
    """One line per rate, and the highest rate that kept the promise."""
    lines = [
        f"{'rate (req/s)':>12}{'served':>9}{'req/s':>9}{'out tok/s':>11}{'p99 TTFT':>10}{'p99 TPOT':>10}",
        "-" * 61,
    ]
    for rate, s in summaries.items():
        lines.append(
            f"{rate:>12g}{s.num_completed:>5}/{s.num_requests:<3}{s.request_throughput:>9.2f}"
            f"{s.output_throughput:>11.1f}{s.ttft_ms.p99:>10.1f}{s.tpot_ms.p99:>10.1f}"
        )
    if promise is not None:
        best = best_rate(summaries, promise)
        lines.append(
            f"highest rate with {promise.describe()}: " + (f"{best:g} req/s" if best is not None else "none of these")
        )
    return "\n".join(lines)
