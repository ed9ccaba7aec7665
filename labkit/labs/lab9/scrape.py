"""A Prometheus scrape read into numbers: what lab 9's notebook reads ``/metrics`` with, and the dashboard check too."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a scrape by name and labels, without the labels every series carries.

    ``vllm:prompt_tokens_total``, ``vllm:request_success_total{finished_reason="stop"}``,
    ``vllm:time_to_first_token_seconds_bucket{le="0.1"}`` ... -> value.
    """
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {k: v for k, v in sample.labels.items() if k not in ("model_name", "engine")}
            key = sample.name + (
                "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}" if labels else ""
            )
            samples[key] = sample.value
    return samples
