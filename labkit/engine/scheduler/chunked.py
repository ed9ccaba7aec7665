"""Chunked prefill with a per-step token budget (SARATHI / vLLM V1 style).

One budget, ``max_num_batched_tokens``, caps the tokens a step computes. Running decodes
take theirs first (one each); what is left goes to prompts, cut into chunks when they do
not fit whole. A long prompt then no longer stalls everyone's next token: decode latency
stays flat while the prompt is worked through over several steps.
"""

from __future__ import annotations

from labkit.engine.scheduler.continuous import ContinuousBatching


class ChunkedPrefill(ContinuousBatching):
    name = "chunked"
    chunked = True
