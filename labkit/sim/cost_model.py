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

The models served now bend two of the terms (see :class:`ModelSpec`): a mixture of experts
reads, per pass, the weights less the experts none of its tokens chose
(:meth:`CostModel.weight_bytes_read`) and computes with its active parameters only; a
sliding-window layer reads at most its window of each sequence's context.

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

from labkit.sim import moe
from labkit.sim.hardware import GB, Hardware


@dataclass(frozen=True)
class ModelSpec:
    """The shape of a decoder-only model that serving cost depends on.

    A dense model needs the first five fields. The rest describe the models served now:

    * a mixture of experts (``experts``, ``experts_per_token``, ``active_parameters``,
      ``shared_experts``): weights cost memory for all ``parameters``, arithmetic for the
      active ones, and a decode step reads what its batch touches (:meth:`weight_bytes_read`);
    * multi-head latent attention (``kv_lora_rank``, ``qk_rope_head_dim``): each layer caches
      one compressed latent and one RoPE key per token, shared by every head;
    * sliding-window layers (``sliding_window``, ``sliding_layers``): those layers keep only the
      last window of tokens, so a long conversation's cache grows in the other layers only (:meth:`kv_bytes`).
    """

    name: str
    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    bytes_per_param: float = 2.0  # 2 for BF16; about 0.52 for 4-bit weights with their scales
    kv_bytes_per_value: float = 2.0  # the KV cache is usually kept in 16-bit even for quantized weights
    query_heads: int | None = None  # attention heads (num_attention_heads); None: attention arithmetic unknown
    context_length: int | None = None  # the longest sequence it was trained for; None: not known
    hidden_size: int | None = None  # the width of the activations (for the GPUs' all-reduces); None: not given
    # A mixture of experts (all 0/None for a dense model): see the class docstring.
    active_parameters: float | None = None  # parameters one token computes with (the model card's "active")
    experts: int = 0  # routed experts per MoE layer (n_routed_experts, num_experts, num_local_experts)
    experts_per_token: int = 0  # the router's top-k (num_experts_per_tok)
    shared_experts: int = 0  # experts every token runs (n_shared_experts): inside the active parameters
    expert_bytes_per_param: float | None = None  # routed experts stored apart (gpt-oss: MXFP4); None: bytes_per_param
    # Multi-head latent attention (MLA): what each layer caches per token instead of keys and values per head.
    kv_lora_rank: int | None = None  # the compressed latent (kv_lora_rank)
    qk_rope_head_dim: int | None = None  # the decoupled RoPE key cached beside it (qk_rope_head_dim)
    # Sliding-window layers: each keeps only the last ``sliding_window`` tokens.
    sliding_window: int | None = None
    sliding_layers: int = 0  # how many of the layers slide (the rest attend to everything)

    def __post_init__(self) -> None:
        for field_name in ("parameters", "layers", "kv_heads", "head_dim", "bytes_per_param", "kv_bytes_per_value"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field_name} must be positive, got {value!r}; "
                    "take it from the model's config.json"
                )
        for field_name in (
            "query_heads",
            "context_length",
            "hidden_size",
            "kv_lora_rank",
            "qk_rope_head_dim",
            "sliding_window",
        ):
            value = getattr(self, field_name)
            if value is not None and not (isinstance(value, int) and value >= 1):
                raise ValueError(
                    f"ModelSpec {self.name!r}: {field_name} must be a whole number, 1 or more, or None; "
                    f"got {value!r}; take it from the model's config.json"
                )
        self._check_experts()
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise ValueError(
                f"ModelSpec {self.name!r}: multi-head latent attention needs both kv_lora_rank and "
                "qk_rope_head_dim (512 and 64 for DeepSeek-V3), or neither"
            )
        if (self.sliding_window is None) != (self.sliding_layers == 0) or not 0 <= self.sliding_layers <= self.layers:
            raise ValueError(
                f"ModelSpec {self.name!r}: give sliding_window with sliding_layers from 1 to layers ({self.layers}), "
                f"or neither; got sliding_window={self.sliding_window!r}, sliding_layers={self.sliding_layers!r}"
            )

    def _check_experts(self) -> None:
        """A dense model names no experts; a mixture names experts, a top-k below them, and fewer active parameters."""
        if self.experts == 0:
            if (
                self.experts_per_token
                or self.shared_experts
                or self.active_parameters is not None
                or (self.expert_bytes_per_param is not None)
            ):
                raise ValueError(
                    f"ModelSpec {self.name!r}: experts_per_token, shared_experts and active_parameters describe a "
                    "mixture of experts; give experts (the number of routed experts) too"
                )
            return
        if not (isinstance(self.experts, int) and isinstance(self.experts_per_token, int)):
            raise ValueError(f"ModelSpec {self.name!r}: experts and experts_per_token must be whole numbers")
        if not 1 <= self.experts_per_token < self.experts or self.shared_experts < 0:
            raise ValueError(
                f"ModelSpec {self.name!r}: a router picks experts_per_token from 1 to experts - 1 "
                f"(got {self.experts_per_token!r} of {self.experts!r}), and shared_experts is 0 or more"
            )
        if self.expert_bytes_per_param is not None and not self.expert_bytes_per_param > 0:
            raise ValueError(f"ModelSpec {self.name!r}: expert_bytes_per_param must be positive or None")
        if self.active_parameters is None or not 0 < self.active_parameters < self.parameters:
            raise ValueError(
                f"ModelSpec {self.name!r}: a mixture of experts needs active_parameters, more than 0 and fewer "
                f"than its {self.parameters:,.0f} parameters (the model card's active count)"
            )

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def active(self) -> float:
        """Parameters one token computes with: the active count of a mixture, all of a dense model."""
        return self.parameters if self.active_parameters is None else self.active_parameters

    @property
    def expert_parameters(self) -> float:
        """One routed expert's parameters, summed over the MoE layers; 0 for a dense model.

        The parameters a token does not use are the E - k routed experts it did not choose, so one
        expert holds (parameters - active) / (E - k). The count is slightly high when the total counts
        an embedding table that the active count leaves out (a lookup, not a matmul): 0.6B of
        gpt-oss-20b's 20.9B, which makes this 3% more than its config's 24 x 24.9M.
        """
        if not self.is_moe:
            return 0.0
        return (self.parameters - self.active) / (self.experts - self.experts_per_token)

    @property
    def expert_bytes(self) -> float:
        """One routed expert's bytes, all its layers: its parameters at the experts' storage."""
        per_param = self.bytes_per_param if self.expert_bytes_per_param is None else self.expert_bytes_per_param
        return self.expert_parameters * per_param

    def weight_bytes_read(self, tokens: float) -> float:
        """Weight bytes a pass of ``tokens`` tokens reads: all of a dense model; a mixture's shared part and touched experts.

        weight bytes - (E - D(tokens)) x expert bytes, with D the expected distinct experts of
        :func:`labkit.sim.moe.expected_distinct_experts`: the active parameters at one token, all of
        them once the batch covers every expert.
        """
        experts = self.experts if self.is_moe else 0
        return moe.weight_bytes_read(self.weight_bytes, experts, self.experts_per_token, self.expert_bytes, tokens)

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
        """All the weights: parameters x bytes each, a mixture's routed experts at their own storage."""
        routed = self.experts * self.expert_parameters
        return (self.parameters - routed) * self.bytes_per_param + self.experts * self.expert_bytes

    @property
    def kv_bytes_per_token_per_layer(self) -> float:
        """What one layer caches for one token.

        A key and a value per KV head, 2 x kv_heads x head_dim x bytes; with multi-head latent
        attention one latent and one RoPE key shared by every head, (kv_lora_rank + qk_rope_head_dim) x bytes.
        """
        if self.kv_lora_rank is not None and self.qk_rope_head_dim is not None:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes_per_value
        return 2 * self.kv_heads * self.head_dim * self.kv_bytes_per_value

    @property
    def kv_bytes_per_token(self) -> float:
        """What a token adds to the cache while it is inside every window: layers x the per-layer figure.

        2 x layers x kv_heads x head_dim x bytes for a model that caches keys and values per head.
        """
        return self.layers * self.kv_bytes_per_token_per_layer

    @property
    def windowed_kv_bytes_per_token(self) -> float:
        """The share of :attr:`kv_bytes_per_token` that sliding-window layers hold; 0 without them."""
        return self.sliding_layers * self.kv_bytes_per_token_per_layer

    def kv_bytes(self, tokens: float) -> float:
        """KV bytes of one sequence of ``tokens`` tokens: each sliding-window layer holds at most its window.

        per layer x (full layers x tokens + sliding layers x min(tokens, window)).
        """
        if self.sliding_window is None:
            return tokens * self.kv_bytes_per_token
        capped = min(tokens, self.sliding_window)
        return tokens * self.kv_bytes_per_token - (tokens - capped) * self.windowed_kv_bytes_per_token


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
    return math.floor((usable - model.weight_bytes) / model.kv_bytes(tokens_per_conversation))


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
    # A mixture of experts: each pass reads the weights less the experts its tokens leave untouched.
    experts: int = 0
    experts_per_token: int = 0
    expert_bytes: float = 0.0  # one routed expert, all its layers
    # Sliding-window layers: their share of kv_bytes_per_token is read for at most the window of each sequence.
    sliding_window: int | None = None
    windowed_kv_bytes_per_token: float = 0.0

    def __post_init__(self) -> None:
        for field_name in ("bandwidth", "flops", "weight_bytes", "kv_bytes_per_token", "flops_per_token"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(
                    f"CostModel: {field_name} must be positive, got {value!r}; "
                    "a zero rate would make every pass take forever"
                )
        for field_name in ("overhead_s", "attention_s_per_token", "expert_bytes", "windowed_kv_bytes_per_token"):
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
            flops_per_token=2 * model.active,
            experts=model.experts,
            experts_per_token=model.experts_per_token,
            expert_bytes=model.expert_bytes,
            sliding_window=model.sliding_window,
            windowed_kv_bytes_per_token=model.windowed_kv_bytes_per_token,
        )

    def weight_bytes_read(self, tokens: float) -> float:
        """Weight bytes a pass computing ``tokens`` tokens reads: all of them, less the experts no token chose.

        weight bytes - (E - D(tokens)) x expert bytes, D from :func:`labkit.sim.moe.expected_distinct_experts`;
        a dense model reads all its weights whatever the batch.
        """
        return moe.weight_bytes_read(self.weight_bytes, self.experts, self.experts_per_token, self.expert_bytes, tokens)

    def sequence_kv_bytes(self, context_len: float) -> float:
        """KV bytes a pass reads for one sequence of ``context_len`` tokens: windowed layers read at most the window."""
        return self._kv_read_bytes(context_len, self._windowed(context_len))

    def _windowed(self, context_len: float) -> float:
        return context_len if self.sliding_window is None else min(context_len, self.sliding_window)

    def _kv_read_bytes(self, context_tokens: float, windowed_context_tokens: float) -> float:
        """All layers' bytes for the context, less what the windowed layers hold no longer."""
        return self.kv_bytes_per_token * context_tokens - self.windowed_kv_bytes_per_token * (
            context_tokens - windowed_context_tokens
        )

    def pass_breakdown(
        self, new_tokens: int, context_tokens: float, windowed_context_tokens: float | None = None
    ) -> PassTime:
        """The terms of a pass computing ``new_tokens`` while reading ``context_tokens`` of KV cache.

        Both are totals over the batch (``context_tokens`` may be an average's total, not a whole number).
        ``windowed_context_tokens`` is the batch's total of min(context, window), what sliding-window
        layers read; None takes all of the context (exact when no sequence is past the window).
        :meth:`step_breakdown` works it out from each sequence.
        """
        if new_tokens < 1 or context_tokens < 0:
            raise ValueError(
                f"a pass computes at least one token and reads no negative context; got "
                f"new_tokens={new_tokens}, context_tokens={context_tokens}"
            )
        windowed = context_tokens if windowed_context_tokens is None else windowed_context_tokens
        bytes_moved = self.weight_bytes_read(new_tokens) + self._kv_read_bytes(context_tokens, windowed)
        return PassTime(
            bytes_moved / self.bandwidth,
            self.flops_per_token * new_tokens / self.flops,
            self.overhead_s,
            self.attention_s_per_token * context_tokens,
        )

    def pass_time(self, new_tokens: int, context_tokens: float, windowed_context_tokens: float | None = None) -> float:
        """Seconds of a pass over batch totals; see :meth:`pass_breakdown`."""
        return self.pass_breakdown(new_tokens, context_tokens, windowed_context_tokens).total_s

    def step_breakdown(self, batch: Iterable[SequenceWork | tuple[int, int]]) -> PassTime:
        """The terms of one step, given each sequence's (new tokens, context length)."""
        new_tokens = context_tokens = 0
        windowed: float = 0
        for index, (new, context) in enumerate(batch):
            if new < 1 or context < 0:
                raise ValueError(
                    f"sequence {index} in the batch has new_tokens={new}, context_len={context}; "
                    "each sequence computes at least one token and has a context of 0 or more"
                )
            new_tokens += new
            context_tokens += context
            windowed += self._windowed(context)
        if new_tokens == 0:
            raise ValueError("the batch is empty; a step needs at least one sequence")
        return self.pass_breakdown(new_tokens, context_tokens, windowed)

    def step_time(self, batch: Iterable[SequenceWork | tuple[int, int]]) -> float:
        """Seconds of one step, given each sequence's (new tokens, context length)."""
        return self.step_breakdown(batch).total_s

    def prefill_time(self, prompt_len: int, cached_len: int = 0) -> float:
        """Seconds to prefill one prompt alone, ``cached_len`` of its tokens already in the cache."""
        return self.pass_time(prompt_len - cached_len, cached_len)

    def decode_step_time(self, batch_size: int, mean_context: float) -> float:
        """Seconds of a decode step: ``batch_size`` sequences, one new token each, ``mean_context`` cached."""
        return self.pass_time(batch_size, batch_size * mean_context, batch_size * self._windowed(mean_context))

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
        """Tokens/s one sequence can never beat: every token must read all the weights (a mixture: its active ones)."""
        return self.bandwidth / self.weight_bytes_read(1)

    @property
    def critical_batch(self) -> float:
        """Tokens per pass at which the arithmetic takes as long as reading the weights.

        weight_bytes / bandwidth = tokens x flops_per_token / flops, so
        tokens = flops / bandwidth x weight_bytes / flops_per_token
               = flops / bandwidth x bytes_per_param / 2.
        Fewer tokens per pass: memory-bound (batching is nearly free). More: compute-bound.
        A mixture of experts reads more weights as its batch touches more experts, so the
        equation has no closed form: :func:`_crossing` solves it, and the batch is larger.
        """
        if not self.experts:
            return self.flops / self.bandwidth * self.weight_bytes / self.flops_per_token
        return _crossing(
            lambda tokens: tokens * self.flops_per_token / self.flops - self.weight_bytes_read(tokens) / self.bandwidth
        )

    def decode_crossover_batch(self, context_len: float) -> float:
        """Batch size at which a decode step turns compute-bound, each sequence holding ``context_len``.

        Solves (W + B c k) / bandwidth = B f / flops for B. Every sequence's KV read
        pushes the crossover out; when a sequence's KV read alone takes as long as its
        arithmetic, decode never turns compute-bound and this is infinite. A mixture's W grows
        with B (:meth:`weight_bytes_read`), solved by :func:`_crossing`.
        """
        kv_s = self.sequence_kv_bytes(context_len) / self.bandwidth
        per_sequence_gap = self.flops_per_token / self.flops - kv_s
        if per_sequence_gap <= 0:
            return float("inf")
        if not self.experts:
            return self.weight_bytes / self.bandwidth / per_sequence_gap
        return _crossing(lambda batch: batch * per_sequence_gap - self.weight_bytes_read(batch) / self.bandwidth)


def _crossing(gap) -> float:
    """Where an increasing-at-last, convex ``gap(x)`` (arithmetic time less memory time) turns from negative to zero.

    Doubling finds a point past it, bisection closes in to 1e-9 of it.
    """
    high = 1.0
    while gap(high) < 0:
        high *= 2
    low = 0.0
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        low, high = (middle, high) if gap(middle) < 0 else (low, middle)
    return high


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
