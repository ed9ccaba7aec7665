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
counts as failed, never silently dropped. A sweep over rates finds the highest that keeps
p99 TPOT within a promise.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from labkit.metrics import Summary
from labkit.trace import RequestRecord, Trace
from labkit.workloads import Workload, arrival_times, sale_workload, sharegpt_prompts, synthetic_workload

DATASETS = ("sale", "sharegpt", "random")
# Plain words for the random dataset: the client has no tokenizer, so lengths are about 1.3 tokens a word.
WORDS = (
    "time person year way day thing man world life hand part child eye woman place work week case point "
    "number group problem fact money market story water light house river train music cloud garden"
).split()


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


def make_workload(
    dataset: str,
    num_prompts: int,
    rate: float,
    burstiness: float = 1.0,
    seed: int = 0,
    max_output_tokens: int = 128,
    input_len: int = 64,
    output_len: int = 32,
) -> Workload:
    """The requests to send: ``num_prompts`` of ``dataset`` with Poisson/gamma arrivals at ``rate``."""
    if dataset == "sale":
        return sale_workload(num_prompts, rate, burstiness=burstiness, seed=seed, max_answer_len=max_output_tokens)
    if dataset == "sharegpt":
        prompts = sharegpt_prompts(num_prompts, seed, max_prompt_tokens=1024, max_output_tokens=max_output_tokens)
        return prompts.with_arrival_times(arrival_times(num_prompts, rate, burstiness, seed))
    if dataset == "random":
        workload = synthetic_workload(
            num_prompts, rate, input_len, output_len, burstiness=burstiness, seed=seed, name="random"
        )
        rng = np.random.default_rng(seed)
        requests = [
            replace(
                r,
                prompt=[
                    {"role": "user", "content": " ".join(rng.choice(WORDS, size=max(1, round(r.prompt_len / 1.3))))}
                ],
            )
            for r in workload
        ]
        return replace(workload, requests=tuple(requests))
    raise ValueError(f"unknown dataset {dataset!r}; use one of {', '.join(DATASETS)}")


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


def keeps_promise(summary: Summary, promise_ms: float, ttft_promise_ms: float | None = None) -> bool:
    """Every request served, p99 TPOT within ``promise_ms`` and, if given, p99 TTFT within
    ``ttft_promise_ms`` (a lost request breaks any promise)."""
    ttft_kept = ttft_promise_ms is None or summary.ttft_ms.p99 <= ttft_promise_ms
    return summary.num_completed == summary.num_requests and summary.tpot_ms.p99 <= promise_ms and ttft_kept


def best_rate(summaries: dict[float, Summary], promise_ms: float, ttft_promise_ms: float | None = None) -> float | None:
    """The highest rate below the first (lowest) rate that breaks the promise, or None if the lowest does.

    A rate that happens to pass above one that failed is noise, not capacity: the promise has to
    hold at every load up to the one we sign.
    """
    best = None
    for rate in sorted(summaries):
        if not keeps_promise(summaries[rate], promise_ms, ttft_promise_ms):
            break
        best = rate
    return best


def format_bench(summary: Summary, max_concurrency: int | None = None, errors: list[str] = ()) -> str:
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


def format_sweep(
    summaries: dict[float, Summary], promise_ms: float | None, ttft_promise_ms: float | None = None
) -> str:
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
    if promise_ms is not None:
        best = best_rate(summaries, promise_ms, ttft_promise_ms)
        ttft = "" if ttft_promise_ms is None else f", p99 TTFT <= {ttft_promise_ms:g} ms"
        lines.append(
            f"highest rate with p99 TPOT <= {promise_ms:g} ms{ttft} and nothing lost: "
            + (f"{best:g} req/s" if best is not None else "none of these")
        )
    return "\n".join(lines)
