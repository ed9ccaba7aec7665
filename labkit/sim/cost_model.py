"""How long one forward pass takes, from four constants and the size of the KV cache.

The lesson's cost model: a pass moves its bytes over the memory link and does its
arithmetic, the slower of the two sets its length, and a fixed overhead (kernel
launches, scheduling, sampling) is added on top::

    t_pass = max(bytes / bandwidth, flops / rate) + overhead
    bytes  = weight bytes + KV bytes per token x (context of every sequence in the batch)
    flops  = 2 x parameters x (tokens computed in the pass)

The four constants are ``bandwidth``, ``flops`` (the arithmetic rate), ``weight_bytes`` and
``overhead_s``; the model adds ``kv_bytes_per_token`` and ``flops_per_token`` (2 x parameters).

Left out, as the lesson leaves them out:

* attention arithmetic. Scores and the weighted sum cost about 4 x layers x query heads x
  head_dim x context FLOPs per token; for Llama 3.1 8B at a 1,150-token context that is
  about 0.6 GFLOP against the 16 GFLOP of the weights (4%), more for long prompts.
* writing the new tokens' KV entries (one token's worth per sequence in a decode step),
  activations, and any kernel that runs below its peak rate.

One optional term is not in the lesson: ``attention_s_per_token``, seconds per token of KV
context read on top of its bytes. It is 0 unless a calibration measures it (``labkit
calibrate``): on a GPU, attention streams the cache at nearly full bandwidth and the bytes
term covers it, but a plain-PyTorch paged attention on a CPU copies the blocks it gathers
and runs an attention kernel made for long queries, so each context token costs several
times the time its bytes take to read, after the weights' arithmetic, not overlapped with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, NamedTuple

from labkit.sim.hardware import GB, Hardware


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only model that serving cost depends on."""

    name: str
    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0  # 2 for BF16; about 0.52 for 4-bit weights with their scales
    kv_bytes_per_value: float = 2.0  # the KV cache is usually kept in 16-bit even for quantized weights
    query_heads: int | None = None  # attention heads (num_attention_heads); None: attention arithmetic unknown
    context_length: int | None = None  # the longest sequence it was trained for; None: not known

    def __post_init__(self) -> None:
        for field_name in ("parameters", "layers", "kv_heads", "head_dim", "bytes_per_param", "kv_bytes_per_value"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field_name} must be positive, got {value!r}; "
                    "take it from the model's config.json"
                )
        for field_name in ("query_heads", "context_length"):
            value = getattr(self, field_name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field_name} must be a whole number, 1 or more, or None; "
                    f"got {value!r}; take it from the model's config.json"
                )

    def prefill_attention_flops(self, prompt_len: int) -> float:
        """Attention's own arithmetic (scores and weighted sum) over a whole prompt, causal, in FLOPs.

        The token at position i (1-based) scores itself against i keys and sums i values in every
        query head: 2 x i x head_dim FLOPs each, so 4 x layers x query_heads x head_dim x i per token.
        Summed over i = 1..L: 2 x layers x query_heads x head_dim x L x (L + 1). The weights' 2 x
        parameters per token grow linearly with L, this quadratically: Llama 3.1 8B's equals its
        weights' near 61K tokens. Needs ``query_heads``.
        """
        if self.query_heads is None:
            raise ValueError(f"{self.name} names no query_heads (num_attention_heads of its config.json)")
        return 2.0 * self.layers * self.query_heads * self.head_dim * prompt_len * (prompt_len + 1)

    @property
    def weight_bytes(self) -> float:
        return self.parameters * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """A key and a value, per layer, per KV head: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_value


# Parameter counts worked out from each model's config.json (embeddings included); query heads are its
# num_attention_heads. Context lengths: Llama 3.1's model card gives 128K (max_position_embeddings
# 131,072); Qwen3 8B's model card gives 32,768 tokens natively (131,072 only with YaRN scaling, not
# counted here); SmolLM2's config.json gives max_position_embeddings 8,192.
MODELS: dict[str, ModelSpec] = {
    "llama-3.1-8b": ModelSpec(
        "Llama 3.1 8B", 8_030_261_248, layers=32, kv_heads=8, head_dim=128, query_heads=32, context_length=131_072
    ),
    "qwen3-8b": ModelSpec(
        "Qwen3 8B", 8_190_735_360, layers=36, kv_heads=8, head_dim=128, query_heads=32, context_length=32_768
    ),
    "smollm2-135m": ModelSpec(
        "SmolLM2 135M", 134_515_008, layers=30, kv_heads=3, head_dim=64, query_heads=9, context_length=8_192
    ),
}


def get_model(name: str | ModelSpec) -> ModelSpec:
    """A model preset by name (``"llama-3.1-8b"``), or a ModelSpec passed through."""
    if isinstance(name, ModelSpec):
        return name
    try:
        return MODELS[name.lower()]
    except KeyError:
        raise ValueError(
            f"unknown model {name!r}; use one of {sorted(MODELS)} "
            "or build a ModelSpec(name, parameters, layers, kv_heads, head_dim)"
        ) from None


def conversations_that_fit(
    gpu_memory_bytes: float, memory_fraction: float, model: ModelSpec, tokens_per_conversation: int
) -> int:
    """How many conversations of ``tokens_per_conversation`` tokens fit beside the weights."""
    if not 0 < memory_fraction <= 1:
        raise ValueError(
            f"memory_fraction must be in (0, 1], got {memory_fraction!r}; 0.9 (vLLM's default) is a usual choice"
        )
    if not gpu_memory_bytes > 0:
        raise ValueError(f"gpu_memory_bytes must be positive, got {gpu_memory_bytes!r}")
    usable = gpu_memory_bytes * memory_fraction
    if model.weight_bytes >= usable:
        raise ValueError(
            f"the weights of {model.name} ({model.weight_bytes / GB:.1f} GB) do not fit in "
            f"{memory_fraction:.0%} of {gpu_memory_bytes / GB:.1f} GB; use a GPU with more memory, "
            "fewer bytes per parameter (quantize) or several GPUs"
        )
    return math.floor((usable - model.weight_bytes) / (tokens_per_conversation * model.kv_bytes_per_token))


class SequenceWork(NamedTuple):
    """One sequence's share of a pass: tokens it computes now, tokens already in its KV cache."""

    new_tokens: int
    context_len: int


class PassTime(NamedTuple):
    """The terms of one pass, in seconds: the larger of the first two, plus the overhead (and attention)."""

    memory_s: float
    compute_s: float
    overhead_s: float
    attention_s: float = 0.0  # the calibrated extra cost of reading the context; 0 in the lesson's model

    @property
    def total_s(self) -> float:
        return max(self.memory_s, self.compute_s) + self.overhead_s + self.attention_s

    @property
    def bound(self) -> str:
        """Which resource sets the pass's length: ``"memory"`` or ``"compute"``."""
        return "memory" if self.memory_s >= self.compute_s else "compute"


@dataclass(frozen=True)
class CostModel:
    """Step times from bandwidth (bytes/s), arithmetic rate (FLOP/s), weight bytes and overhead (s)."""

    bandwidth: float
    flops: float
    weight_bytes: float
    overhead_s: float
    kv_bytes_per_token: float
    flops_per_token: float
    attention_s_per_token: float = 0.0  # see the module docstring; fitted by a calibration

    def __post_init__(self) -> None:
        for field_name in ("bandwidth", "flops", "weight_bytes", "kv_bytes_per_token", "flops_per_token"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(
                    f"CostModel: {field_name} must be positive, got {value!r}; "
                    "a zero rate would make every pass take forever"
                )
        for field_name in ("overhead_s", "attention_s_per_token"):
            if getattr(self, field_name) < 0:
                raise ValueError(f"CostModel: {field_name} must be zero or more, got {getattr(self, field_name)!r}")

    @classmethod
    def from_parts(cls, hardware: Hardware, model: ModelSpec, overhead_s: float = 0.0) -> "CostModel":
        """The cost model of ``model`` served on ``hardware`` with a fixed per-pass overhead."""
        return cls(
            bandwidth=hardware.bandwidth,
            flops=hardware.flops,
            weight_bytes=model.weight_bytes,
            overhead_s=overhead_s,
            kv_bytes_per_token=model.kv_bytes_per_token,
            flops_per_token=2 * model.parameters,
        )

    def pass_breakdown(self, new_tokens: int, context_tokens: float) -> PassTime:
        """The terms of a pass computing ``new_tokens`` while reading ``context_tokens`` of KV cache.

        Both are totals over the batch (``context_tokens`` may be an average's total, not a whole number).
        The simulator calls this (or :meth:`pass_time`) every step.
        """
        if new_tokens < 1 or context_tokens < 0:
            raise ValueError(
                f"a pass computes at least one token and reads no negative context; got "
                f"new_tokens={new_tokens}, context_tokens={context_tokens}"
            )
        bytes_moved = self.weight_bytes + self.kv_bytes_per_token * context_tokens
        return PassTime(
            bytes_moved / self.bandwidth,
            self.flops_per_token * new_tokens / self.flops,
            self.overhead_s,
            self.attention_s_per_token * context_tokens,
        )

    def pass_time(self, new_tokens: int, context_tokens: float) -> float:
        """Seconds of a pass over batch totals; see :meth:`pass_breakdown`."""
        return self.pass_breakdown(new_tokens, context_tokens).total_s

    def step_breakdown(self, batch: Iterable[SequenceWork | tuple[int, int]]) -> PassTime:
        """The terms of one step, given each sequence's (new tokens, context length)."""
        new_tokens = context_tokens = 0
        for index, (new, context) in enumerate(batch):
            if new < 1 or context < 0:
                raise ValueError(
                    f"sequence {index} in the batch has new_tokens={new}, context_len={context}; "
                    "each sequence computes at least one token and has a context of 0 or more"
                )
            new_tokens += new
            context_tokens += context
        if new_tokens == 0:
            raise ValueError("the batch is empty; a step needs at least one sequence")
        return self.pass_breakdown(new_tokens, context_tokens)

    def step_time(self, batch: Iterable[SequenceWork | tuple[int, int]]) -> float:
        """Seconds of one step, given each sequence's (new tokens, context length)."""
        return self.step_breakdown(batch).total_s

    def prefill_time(self, prompt_len: int, cached_len: int = 0) -> float:
        """Seconds to prefill one prompt alone, ``cached_len`` of its tokens already in the cache."""
        return self.pass_time(prompt_len - cached_len, cached_len)

    def decode_step_time(self, batch_size: int, mean_context: float) -> float:
        """Seconds of a decode step: ``batch_size`` sequences, one new token each, ``mean_context`` cached."""
        return self.pass_time(batch_size, batch_size * mean_context)

    def speculative_step_time(
        self, batch_size: int, mean_context: float, k: int, draft_cost: "CostModel | None" = None
    ) -> float:
        """Seconds of a speculative decode step: each sequence verifies ``k`` drafts plus its own token.

        One target pass computes ``batch_size x (k + 1)`` tokens while reading each sequence's context
        once; a draft model (``draft_cost``) adds ``k`` passes of one token per sequence before it.
        Prompt lookup drafts for free (``draft_cost=None``).
        """
        verify = self.pass_time(batch_size * (k + 1), batch_size * mean_context)
        drafting = 0.0 if draft_cost is None else k * draft_cost.pass_time(batch_size, batch_size * mean_context)
        return verify + drafting

    @property
    def single_stream_bound(self) -> float:
        """Tokens/s one sequence can never beat: every token must read all the weights."""
        return self.bandwidth / self.weight_bytes

    @property
    def critical_batch(self) -> float:
        """Tokens per pass at which the arithmetic takes as long as reading the weights.

        weight_bytes / bandwidth = tokens x flops_per_token / flops, so
        tokens = flops / bandwidth x weight_bytes / flops_per_token
               = flops / bandwidth x bytes_per_param / 2.
        Fewer tokens per pass: memory-bound (batching is nearly free). More: compute-bound.
        """
        return self.flops / self.bandwidth * self.weight_bytes / self.flops_per_token

    def decode_crossover_batch(self, context_len: float) -> float:
        """Batch size at which a decode step turns compute-bound, each sequence holding ``context_len``.

        Solves (W + B c k) / bandwidth = B f / flops for B. Every sequence's KV read
        pushes the crossover out; when a sequence's KV read alone takes as long as its
        arithmetic, decode never turns compute-bound and this is infinite.
        """
        per_sequence_gap = self.flops_per_token / self.flops - context_len * self.kv_bytes_per_token / self.bandwidth
        if per_sequence_gap <= 0:
            return float("inf")
        return self.weight_bytes / self.bandwidth / per_sequence_gap


def expected_tokens_per_step(k: int, acceptance_rate: float) -> float:
    """Tokens a sequence gains per speculative step: (1 - a^(k+1)) / (1 - a) (Leviathan et al.).

    Each draft token is accepted with probability ``a``, independently, until the first rejection;
    the target's own token always comes on top. k = 0 (no speculation) gives 1.
    """
    if k < 0 or not 0 <= acceptance_rate <= 1:
        raise ValueError(f"need k >= 0 and an acceptance rate in [0, 1], got k={k}, acceptance_rate={acceptance_rate}")
    if acceptance_rate == 1:
        return k + 1.0
    return (1 - acceptance_rate ** (k + 1)) / (1 - acceptance_rate)
