"""``/metrics``: the server's state and latencies for Prometheus, with vLLM's names, meanings and buckets.

A dashboard built for vLLM reads this server unchanged, and what a learner sees here is what
they will see at work. Names, help texts and bucket edges follow vLLM's
``vllm/v1/metrics/loggers.py`` (V1 engine; ``inter_token_latency_seconds`` is its name since
0.11 for what was ``time_per_output_token_seconds``). Every metric carries vLLM's labels
``model_name`` and ``engine``. Counters show up with ``_total`` appended, as Prometheus
counters do (``vllm:prompt_tokens_total``). The prefix cache is read as vLLM's
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (tokens, not blocks): the hit
rate is the ratio of their increases over a window. With speculative decoding on (and only
then, as in vLLM) ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens`` and
``..._num_accepted_tokens`` count the drafts verified; accepted over draft tokens is the
acceptance rate. ``vllm:request_prompt_tokens`` and ``vllm:request_generation_tokens`` are
histograms of each finished request's prompt and answer (vLLM's 1-2-5 buckets up to
``max_model_len``), and ``process_*`` (CPU seconds, resident memory, open files...) are
``prometheus_client``'s process collector, as on every vLLM server.

Times come from the engine's own clock, so they are the engine's view: a request arrives when
the server hands it to the engine loop, its tokens are stamped when the step that made them
ends. Each server has its own registry, so several can live in one process (tests, notebooks).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from labkit.trace import StepRecord

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
)  # fmt: skip
TOKEN_GAP_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort")


def buckets_1_2_5(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value``: vLLM's ``build_1_2_5_buckets``."""
    edges: list[int] = []
    scale = 1
    while True:
        for mantissa in (1, 2, 5):
            if mantissa * scale > max_value:
                return edges
            edges.append(mantissa * scale)
        scale *= 10


LABELS = ("model_name", "engine")


class ServerMetrics:
    """The Prometheus metrics of one server; the engine loop calls the ``on_*`` methods."""

    def __init__(self, model_name: str, speculative: bool = False, max_model_len: int = 2048):
        disable_created_metrics()  # no ``*_created`` series, as vLLM (process-wide, like its own setting)
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total, process_resident_memory_bytes...
        self._labels = dict(model_name=model_name, engine="0")
        self._add_state_and_counters(speculative)
        self._add_histograms(max_model_len)

    def _make(self, kind, name: str, documentation: str, **extra):
        """A metric of ``kind`` in this server's registry, with this server's labels."""
        return kind(name, documentation, LABELS, registry=self.registry, **extra).labels(**self._labels)

    def _add_state_and_counters(self, speculative: bool) -> None:
        """The gauges of the queues and the pool; the counters of tokens, the prefix cache, drafts and requests."""
        make = self._make
        self.running = make(Gauge, "vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = make(Gauge, "vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_usage = make(Gauge, "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.preemptions = make(Counter, "vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = make(Counter, "vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = make(Counter, "vllm:generation_tokens", "Number of generation tokens processed.")
        self.prefix_queries = make(
            Counter, "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
        )
        self.prefix_hits = make(
            Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.spec = None  # vLLM shows the speculation counters only when speculative decoding is on
        if speculative:
            self.spec = (
                make(Counter, "vllm:spec_decode_num_drafts", "Number of spec decoding drafts."),
                make(Counter, "vllm:spec_decode_num_draft_tokens", "Number of draft tokens."),
                make(Counter, "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."),
            )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            LABELS + ("finished_reason",),
            registry=self.registry,
        )
        self.finished = {reason: success.labels(**self._labels, finished_reason=reason) for reason in FINISH_REASONS}

    def _add_histograms(self, max_model_len: int) -> None:
        """Each finished request's latencies, at vLLM's bucket edges, and its prompt and answer lengths."""

        def histogram(name: str, documentation: str, buckets) -> Histogram:
            return self._make(Histogram, name, documentation, buckets=buckets)

        self.ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", TOKEN_GAP_BUCKETS
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        lengths = buckets_1_2_5(max_model_len)
        self.request_prompt = histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.", lengths)
        self.request_generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", lengths
        )

    def watch_tier(self, tier, block_size: int) -> None:
        """Show a slower KV tier's counters (:mod:`labkit.kv.tier`), read from it at each scrape: vLLM's
        ``vllm:external_prefix_cache_queries`` and ``..._hits`` (tokens looked up past the pool's run, and those
        reloaded from the tier instead of computed), and labkit's own ``labkit:kv_offload_*`` for what vLLM
        does not show: blocks spilled, dropped by the bound, lookups missed, and blocks held now."""
        self.registry.register(_TierCollector(tier, block_size, self._labels))

    def on_step(self, record: StepRecord) -> None:
        """After each engine step, from its record: the batch it ran, the queue behind it, the cache it
        filled and found (the prompt tokens of the requests it admitted, and those found cached: both 0 with
        prefix caching off), and its speculation."""
        self.running.set(record.num_active)
        self.waiting.set(record.num_waiting)
        self.kv_usage.set(record.blocks_used / max(record.blocks_total, 1))
        self.preemptions.inc(len(record.preempted))
        self.prefix_queries.inc(record.prefix_cache_queries)
        self.prefix_hits.inc(record.prefix_cache_hits)
        if self.spec is not None:
            counts = (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens)
            for counter, count in zip(self.spec, counts):
                counter.inc(count)

    def on_idle(self) -> None:
        """Nothing left to run: no batch, no queue, and every block back in the pool."""
        self.running.set(0)
        self.waiting.set(0)
        self.kv_usage.set(0.0)

    def on_tokens(self, prompt_len: int, num_new: int, first_token_s: float | None, gaps_s: list[float]) -> None:
        """A request got ``num_new`` tokens; the first one brings its prompt and its TTFT."""
        if first_token_s is not None:
            self.prompt_tokens.inc(prompt_len)
            self.ttft.observe(first_token_s)
        self.generation_tokens.inc(num_new)
        for gap in gaps_s:
            self.itl.observe(gap)

    def on_finish(
        self, reason: str, e2e_s: float, queue_s: float | None, prompt_len: int = 0, num_generated: int = 0
    ) -> None:
        """A request ended: counted by reason, with its prompt and answer lengths; latencies only for
        those that ran to a natural end."""
        self.finished[reason].inc()
        self.request_prompt.observe(prompt_len)
        self.request_generation.observe(num_generated)
        if reason != "abort":
            self.e2e.observe(e2e_s)
            if queue_s is not None:
                self.queue.observe(queue_s)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _TierCollector:
    """The tier's counters as Prometheus metrics, read when scraped (the tier counts; nothing is copied)."""

    COUNTERS = (  # (name, help, the tier's counter, tokens per unit: block_size for tokens, 1 for blocks)
        (
            "vllm:external_prefix_cache_queries",
            "Prompt tokens looked up in the slower KV tier, past the pool's cached run.",
            "queried",
            True,
        ),
        (
            "vllm:external_prefix_cache_hits",
            "Prompt tokens reloaded from the slower KV tier instead of computed.",
            "reloaded",
            True,
        ),
        (
            "labkit:kv_offload_spilled_blocks",
            "Blocks evicted from the KV pool and kept in the slower tier.",
            "spilled",
            False,
        ),
        (
            "labkit:kv_offload_dropped_blocks",
            "Blocks the slower tier dropped to stay within its size (least recently used).",
            "dropped",
            False,
        ),
        (
            "labkit:kv_offload_misses",
            "Lookups past the pool's run whose next block the slower tier lacked.",
            "misses",
            False,
        ),
    )

    def __init__(self, tier, block_size: int, labels: dict[str, str]):
        self.tier, self.block_size, self.labels = tier, block_size, labels

    def collect(self):
        stats, size = self.tier.stats(), self.block_size
        for name, documentation, key, in_tokens in self.COUNTERS:
            family = CounterMetricFamily(name, documentation, labels=LABELS)
            family.add_metric(list(self.labels.values()), stats[key] * (size if in_tokens else 1))
            yield family
        held = GaugeMetricFamily("labkit:kv_offload_blocks", "Blocks the slower tier holds now.", labels=LABELS)
        held.add_metric(list(self.labels.values()), stats["held_blocks"])
        yield held
