"""``/metrics`` of ``labkit route``: per replica, what the router sent, what it has in flight, what it predicted.

The names follow SGLang's router (``sgl_router_*``, whose Rust code vLLM Router was forked from), with
``labkit_router_`` in place of ``sgl_router_`` since this is neither; the label ``worker`` is the replica's URL,
as there. Counters show ``_total`` appended, as Prometheus counters do. SGLang's are ``processed_requests``
(answered below 500), ``running_requests`` (in flight from the router's side: the load ``least_loaded`` and
``cache_aware`` read), ``cache_hits`` / ``cache_misses`` (which SGLang counts over all workers), ``retries`` and
``request_errors{reason}`` (``no_replica_available``, ``replica_timeout``, ``replica_failed_mid_answer``).
labkit's own: ``predicted_cached_tokens``, and ``ejections`` / ``readmissions`` / ``worker_up``
(:mod:`~labkit.serve.router_health`, as Envoy's ``outlier_detection.ejections_total``). Each metric's help says
what it counts. A cache hit is the router's prediction (from the replica's KV events or the shadow index), not
the replica's count: that is the replica's own ``vllm:prefix_cache_hits``.

Beside its own, the router shows what each replica says of itself, read from the replica's ``/metrics`` when
its own are read, with vLLM's names and the label ``worker`` added (as vLLM's production-stack router reads its
engines' stats): :data:`REPLICA_FAMILIES`. A replica that does not answer is left out.

Each router has its own registry, so several can live in one process (tests, notebooks).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, disable_created_metrics, generate_latest
from prometheus_client.parser import text_string_to_metric_families

disable_created_metrics()

# what the router shows of each replica's own /metrics (vLLM's names)
REPLICA_FAMILIES = (
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_queries",
    "vllm:prefix_cache_hits",
)


class RouterMetrics:
    """The router's counters and gauges, one series per replica."""

    def __init__(self, urls: list[str]):
        self.urls = urls
        self.registry = CollectorRegistry()
        worker = ["worker"]

        def counter(name: str, help_text: str, labels: list[str] = worker) -> Counter:
            return Counter(name, help_text, labels, registry=self.registry)

        self.processed = counter("labkit_router_processed_requests", "Requests forwarded to and answered by a replica.")
        self.running = Gauge(
            "labkit_router_running_requests", "Requests in flight at a replica.", worker, registry=self.registry
        )
        self.hits = counter("labkit_router_cache_hits", "Requests routed with a cached prefix predicted there.")
        self.misses = counter("labkit_router_cache_misses", "Requests routed with no cached prefix predicted there.")
        self.cached_tokens = counter(
            "labkit_router_predicted_cached_tokens", "Prompt tokens predicted cached at the replica routed to."
        )
        self.retries = counter(
            "labkit_router_retries", "Requests a replica refused before answering, sent on to the next if any."
        )
        self.ejections = counter("labkit_router_ejections", "Times a replica was taken out of service.")
        self.readmissions = counter("labkit_router_readmissions", "Times an ejected replica was put back in service.")
        self.up = Gauge("labkit_router_worker_up", "1 while a replica is in service.", worker, registry=self.registry)
        self.errors = counter(
            "labkit_router_request_errors", "Requests the router answered with an error itself.", ["reason"]
        )
        per_replica = (self.processed, self.running, self.hits, self.misses, self.cached_tokens, self.retries)
        for url in urls:  # every series shows from the start, at 0
            for metric in (*per_replica, self.ejections, self.readmissions):
                metric.labels(url)
            self.up.labels(url).set(1)

    def routed(self, replica: int, cached_tokens: int) -> None:
        """A replica answered a request the router sent it, predicting ``cached_tokens`` of its prompt cached."""
        url = self.urls[replica]
        self.processed.labels(url).inc()
        (self.hits if cached_tokens > 0 else self.misses).labels(url).inc()
        self.cached_tokens.labels(url).inc(cached_tokens)

    def ejected(self, replica: int) -> None:
        self.ejections.labels(self.urls[replica]).inc()
        self.up.labels(self.urls[replica]).set(0)

    def readmitted(self, replica: int) -> None:
        self.readmissions.labels(self.urls[replica]).inc()
        self.up.labels(self.urls[replica]).set(1)

    def in_flight(self, replica: int, count: int) -> None:
        self.running.labels(self.urls[replica]).set(count)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def replica_families(scraped: dict[str, str]) -> str:
    """The :data:`REPLICA_FAMILIES` of each replica's ``/metrics`` text (URL -> text), one family each with the
    label ``worker`` added, in Prometheus's text format."""
    samples: dict[str, list[str]] = {name: [] for name in REPLICA_FAMILIES}
    kinds: dict[str, tuple[str, str]] = {}
    for url, text in scraped.items():
        for family in text_string_to_metric_families(text):
            if family.name not in samples:
                continue
            kinds[family.name] = (family.type, family.documentation)
            for sample in family.samples:
                labels = {**sample.labels, "worker": url}
                written = ",".join(f'{key}="{_escaped(value)}"' for key, value in sorted(labels.items()))
                samples[family.name].append(f"{sample.name}{{{written}}} {sample.value!r}")
    lines = []
    for name, rows in samples.items():
        if rows:
            kind, documentation = kinds[name]
            lines += [f"# HELP {name} {documentation}", f"# TYPE {name} {kind}", *rows]
    return "".join(line + "\n" for line in lines)


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
