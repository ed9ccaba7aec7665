"""The planner's arithmetic: how many conversations fit, how long a step takes, what the promise costs.

One convention for every GPU: arithmetic at the rate kernels reach, half the datasheet peak
(:data:`~labkit.sim.hardware.ACHIEVABLE_FLOPS_FRACTION`) unless the figure given is already a
measured or achievable one (``Hardware.flops_achievable``); memory bandwidth at its datasheet figure.

Memory decides how many conversations fit (one subtraction, one division); the cost
model decides how long a decode step and a prefill take; the rest is bookkeeping:
GPU time per request, the request ceiling, tokens per second, the price, and the load
that keeps a promise about time per token. Every number is a model output, not a
measurement: it shows which resource binds, then a benchmark has the last word.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from labkit.capacity.parallel import LLAMA_3_1_70B, TensorSplit, does_not_fit, tensor_split
from labkit.capacity.report import render_plan
from labkit.capacity.served_models import SERVED_MODELS
from labkit.sim.cost_model import MODELS, CostModel, ModelSpec, conversations_that_fit, get_model
from labkit.sim.hardware import Hardware, get_hardware
from labkit.sim.moe import expected_distinct_experts

# Bytes per weight of each storage scheme, scales included: int8 keeps one fp16 scale per row
# (negligible), 4-bit adds an fp16 scale and a zero per 128 weights (0.5 + 3/128, the sale lesson's
# "about 0.52"); labkit.models.quant stores them so.
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.52}
# Bytes per cached key or value: vLLM's --kv-cache-dtype fp8 halves the 16-bit cache.
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


# The planner's models: the simulator's presets, the one that needs several GPUs, and the models served now.
PLANNER_MODELS: dict[str, ModelSpec] = {**MODELS, "llama-3.1-70b": LLAMA_3_1_70B, **SERVED_MODELS}


def planner_model(name: str | ModelSpec) -> ModelSpec:
    """A model of :data:`PLANNER_MODELS` by name (``"llama-3.1-70b"``), or a ModelSpec passed through."""
    if isinstance(name, str) and name.lower() in PLANNER_MODELS:
        return PLANNER_MODELS[name.lower()]
    if isinstance(name, str):
        raise ValueError(
            f"unknown model {name!r}; use one of {sorted(PLANNER_MODELS)} "
            "or build a ModelSpec(name, parameters, layers, kv_heads, head_dim)"
        )
    return get_model(name)


def with_precision(model: ModelSpec | str, weights: str | None = None, kv: str | None = None) -> ModelSpec:
    """``model`` with weights stored as ``weights`` (bf16, int8, int4) and its KV cache as ``kv`` (fp16, fp8)."""
    model = planner_model(model)
    changes: dict[str, float | None] = {}
    labels = []
    for what, value, table, field_name in (
        ("weights", weights, WEIGHT_BYTES, "bytes_per_param"),
        ("kv", kv, KV_BYTES, "kv_bytes_per_value"),
    ):
        if value is None:
            continue
        if value not in table:
            raise ValueError(f"unknown {what} precision {value!r}; use one of {sorted(table)}")
        changes[field_name] = table[value]
        labels.append(f"{what} {value}")
    if weights is not None and model.expert_bytes_per_param is not None:
        changes["expert_bytes_per_param"] = None  # every weight, the experts too, stored as ``weights``
    if not changes:
        return model
    return replace(model, name=f"{model.name} ({', '.join(labels)})", **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CapacityPlan:
    """Everything :func:`plan` works out; ``str()`` gives the table (:mod:`labkit.capacity.report`).

    Memory figures are per GPU, times and rates per replica (``tensor_parallel`` GPUs that
    share one copy of the model); the ``fleet_`` properties add up the ``replicas``.
    """

    hardware: Hardware
    model: ModelSpec
    prompt_len: int
    answer_len: int
    memory_fraction: float
    gpu_memory_bytes: float
    tensor_parallel: int  # GPUs per replica, each holding 1/N of the weights and of the KV heads
    replicas: int
    hidden_size: int | None  # the width of what the all-reduces add up; None on one GPU
    # Part 1: how many conversations fit
    weight_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_budget_bytes: float  # memory x fraction - weights, per GPU
    kv_bytes_per_conversation: float  # (prompt + answer) x KV bytes per token (windows capped), per GPU
    conversations: int  # per replica
    # Part 2: how fast, and how much
    single_stream_tokens_per_s: float  # bandwidth / weight bytes
    critical_batch: float  # tokens per pass where arithmetic time = weight-read time
    mean_context: float  # prompt + answer / 2: the average sequence in a full batch
    decode_weight_read_bytes_per_gpu: float  # weights a full decode step reads: all, or a mixture's touched share
    experts_touched: float | None  # expected distinct experts per MoE layer at a full batch; None: dense
    decode_memory_s: float
    decode_compute_s: float
    overhead_s: float
    decode_allreduce_s: float  # the GPUs of a replica adding up their partial results; 0 on one GPU
    decode_step_s: float
    prefill_attention_s: float | None  # attention's own arithmetic in the prefill; None if the model names no heads
    prefill_s: float
    decode_s_per_request: float  # answer x step / conversations
    gpu_s_per_request: float
    request_ceiling_per_s: float
    tokens_per_s: float  # output tokens at the ceiling
    cost_per_million_tokens: float | None
    price_per_gpu_hour: float | None
    # Part 3: the promise to users
    decode_share: float  # fraction of GPU time that decode steps get
    token_interval_s: float  # what a user sees between tokens at the ceiling
    promise_s: float | None
    promise_load_per_s: float | None
    promise_in_flight: float | None

    def to_dict(self) -> dict:
        """Every figure of the plan, the derived ones too, as plain data (what ``labkit plan --json`` prints)."""
        return {
            **asdict(self),
            **{
                name: getattr(self, name)
                for name in (
                    "kv_read_bytes",
                    "speedup_over_single_stream",
                    "promise_capacity_cost",
                    "gpus",
                    "fleet_request_ceiling_per_s",
                    "fleet_tokens_per_s",
                    "fleet_promise_load_per_s",
                )
            },
        }

    @property
    def kv_read_bytes(self) -> float:
        """KV cache a full decode step reads: conversations x mean context x KV bytes per token (windows capped)."""
        return self.conversations * self.model.kv_bytes(self.mean_context)

    @property
    def kv_read_bytes_per_gpu(self) -> float:
        """The share of :attr:`kv_read_bytes` that each GPU of a replica reads."""
        return self.kv_read_bytes * self.kv_bytes_per_token_per_gpu / self.model.kv_bytes_per_token

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.replicas

    @property
    def fleet_request_ceiling_per_s(self) -> float:
        return self.replicas * self.request_ceiling_per_s

    @property
    def fleet_tokens_per_s(self) -> float:
        return self.replicas * self.tokens_per_s

    @property
    def fleet_promise_load_per_s(self) -> float | None:
        return None if self.promise_load_per_s is None else self.replicas * self.promise_load_per_s

    @property
    def speedup_over_single_stream(self) -> float:
        return self.tokens_per_s / self.single_stream_tokens_per_s

    @property
    def promise_capacity_cost(self) -> float | None:
        """Fraction of the request ceiling given up to keep the promise."""
        if self.promise_load_per_s is None:
            return None
        return 1 - self.promise_load_per_s / self.request_ceiling_per_s

    @property
    def carried_load_per_s(self) -> float:
        """Requests/s one replica carries: the load within the promise, or the request ceiling without one."""
        return self.request_ceiling_per_s if self.promise_load_per_s is None else self.promise_load_per_s

    def __str__(self) -> str:
        return render_plan(self)


def load_within_promise(
    cost: CostModel,
    prefill_s: float,
    answer_len: int,
    mean_context: float,
    promise_s: float,
    allreduce_s_per_token: float = 0.0,
) -> tuple[float, float]:
    """Requests/s, and conversations in flight, at which users get a token every ``promise_s``.

    The fixed point. At a load of λ requests/s, prefills take the share λ·p of GPU time
    (p = prefill seconds per request), so decode steps get 1 − λ·p of it and a user waits
    τ = t(B) / (1 − λ·p) between tokens, where t(B) is a decode step with B sequences on
    board. Each conversation decodes for L tokens, i.e. L·τ seconds, so by Little's law
    B = λ·L·τ. Keeping the promise exactly (τ = T) gives B = λ·L·T and

        t(λ·L·T) = T · (1 − λ·p).

    With t(B) = max(m₀ + m₁·B, c₁·B) + o — m₀ = weights / bandwidth, m₁ = mean context ×
    KV bytes per token / bandwidth, c₁ = 2·parameters / rate, o = overhead — a maximum
    stays under a bound only if both of its terms do, and each term is a line in λ:

        memory:      m₀ + o + m₁·L·T·λ ≤ T − T·p·λ   ⇒   λ ≤ (T − m₀ − o) / (L·T·m₁ + T·p)
        arithmetic:       o + c₁·L·T·λ ≤ T − T·p·λ   ⇒   λ ≤ (T − o) / (L·T·c₁ + T·p)

    The load is the smaller bound; the conversations in flight are B = λ·L·T. (The caller
    caps both by memory: if B exceeds the conversations that fit, memory binds first.)
    Split over GPUs, a step also spends a·B on all-reduces (a = ``allreduce_s_per_token``),
    after the maximum: it adds a to both m₁ and c₁.

    A mixture of experts breaks the lines: m₀ grows with B as the batch touches more experts
    (:meth:`CostModel.weight_bytes_read`). Its t(B) still grows with B, so the same equation
    has one root, which :func:`_load_by_bisection` finds.
    """
    if not promise_s > 0:
        raise ValueError(f"promise_s must be positive, got {promise_s!r}; for 50 ms between tokens pass 0.050")
    weight_read_s = cost.weight_bytes_read(1) / cost.bandwidth
    if promise_s <= weight_read_s + cost.overhead_s:
        raise ValueError(
            f"no load keeps a promise of {promise_s * 1e3:.1f} ms per token: a decode step already "
            f"takes {(weight_read_s + cost.overhead_s) * 1e3:.1f} ms to read the weights; promise "
            "more, or use more bandwidth or fewer bytes per parameter"
        )
    kv_s_per_sequence = cost.sequence_kv_bytes(mean_context) / cost.bandwidth + allreduce_s_per_token
    compute_s_per_sequence = cost.flops_per_token / cost.flops + allreduce_s_per_token
    if cost.experts:
        return _load_by_bisection(cost, prefill_s, answer_len, kv_s_per_sequence, compute_s_per_sequence, promise_s)
    memory_bound = (promise_s - weight_read_s - cost.overhead_s) / (
        answer_len * promise_s * kv_s_per_sequence + promise_s * prefill_s
    )
    compute_bound = (promise_s - cost.overhead_s) / (
        answer_len * promise_s * compute_s_per_sequence + promise_s * prefill_s
    )
    load = min(memory_bound, compute_bound)
    return load, load * answer_len * promise_s


def _load_by_bisection(
    cost: CostModel,
    prefill_s: float,
    answer_len: int,
    kv_s_per_sequence: float,
    compute_s_per_sequence: float,
    promise_s: float,
) -> tuple[float, float]:
    """The load of :func:`load_within_promise` when no line describes the step: bisection on λ.

    t(λ·L·T) − T·(1 − λ·p) grows with λ, is negative at 0 (the promise outlasts one weight read)
    and positive at λ = 1/p (prefills take all the time), so it crosses zero once between.
    """

    def late(load: float) -> bool:
        batch = load * answer_len * promise_s
        memory = cost.weight_bytes_read(batch) / cost.bandwidth + batch * kv_s_per_sequence
        step = max(memory, batch * compute_s_per_sequence) + cost.overhead_s
        return step > promise_s * (1 - load * prefill_s)

    low, high = 0.0, 1 / prefill_s
    while high - low > 1e-12 * high:
        middle = (low + high) / 2
        low, high = (low, middle) if late(middle) else (middle, high)
    return low, low * answer_len * promise_s


def plan(
    hardware: Hardware | str,
    model: ModelSpec | str,
    prompt_len: int,
    answer_len: int,
    *,
    memory_fraction: float = 0.9,
    gpu_memory_bytes: float | None = None,
    overhead_s: float = 0.0,
    promise_s: float | None = None,
    price_per_gpu_hour: float | None = None,
    tensor_parallel: int = 1,
    replicas: int = 1,
    hidden_size: int | None = None,
    compute: str = "bf16",
) -> CapacityPlan:
    """Plan GPUs serving conversations of ``prompt_len`` + ``answer_len`` tokens: one, or a fleet.

    ``hardware`` and ``model`` are presets or their names; ``gpu_memory_bytes`` overrides the card's memory. Every
    GPU is rated at its achievable arithmetic rate (``Hardware.achievable``: half a datasheet peak), so a named A100
    and the sale's A100-class card are rated alike. A conversation longer than the model's ``context_length`` is
    refused. The prefill counts attention's own arithmetic, decode steps leave it out (:func:`_prefill_s` says why).
    Times are in seconds (``promise_s=0.050`` for a token every 50 ms); the price is per GPU-hour. The batch is
    assumed full: every conversation that fits is on board, the average one halfway through its answer. See
    :func:`load_within_promise` for the algebra of the promise. ``plan(**SALE_EXAMPLE)`` is the lesson's worked example.

    ``tensor_parallel=N`` splits each replica over N GPUs of a node (:mod:`labkit.capacity.parallel`: it needs the
    card's ``interconnect_bandwidth`` and the model's ``hidden_size``); ``replicas=R`` runs R such copies behind a
    router. The models served now (mixtures of experts, latent attention, sliding windows) plan the same way
    (:mod:`labkit.capacity.served_models`). ``compute="fp8"`` doubles the arithmetic rate on a GPU with fp8
    tensor cores (:meth:`~labkit.sim.hardware.Hardware.with_compute`).
    """
    hardware = get_hardware(hardware).achievable().with_compute(compute)
    model = planner_model(model)
    _check_request(model, prompt_len, answer_len, replicas, price_per_gpu_hour)
    gpu_memory = hardware.memory_bytes if gpu_memory_bytes is None else gpu_memory_bytes
    split = tensor_split(hardware, model, tensor_parallel, hidden_size)
    cost = CostModel.from_parts(hardware, split.shard, overhead_s)
    conversations = _conversations_that_fit(gpu_memory, memory_fraction, model, split, prompt_len + answer_len)
    times = _time_fields(cost, model, split, conversations, prompt_len, answer_len)
    given = dict(prompt_len=prompt_len, answer_len=answer_len, memory_fraction=memory_fraction, replicas=replicas)
    return CapacityPlan(
        hardware=hardware,
        model=model,
        gpu_memory_bytes=gpu_memory,
        tensor_parallel=tensor_parallel,
        hidden_size=split.hidden_size,
        overhead_s=overhead_s,
        price_per_gpu_hour=price_per_gpu_hour,
        cost_per_million_tokens=_cost_per_million_tokens(price_per_gpu_hour, tensor_parallel, times["tokens_per_s"]),
        **given,
        **_memory_fields(cost, model, split, gpu_memory * memory_fraction, conversations, prompt_len + answer_len),
        **times,
        **_promise_fields(cost, times, answer_len, promise_s, split.allreduce_s_per_token, conversations),
    )


def _cost_per_million_tokens(price_per_gpu_hour: float | None, gpus: int, tokens_per_s: float) -> float | None:
    """What a replica of ``gpus`` GPUs charges for a million answer tokens; None without a price."""
    return None if price_per_gpu_hour is None else price_per_gpu_hour * gpus / 3600 / tokens_per_s * 1e6


def _check_request(
    model: ModelSpec, prompt_len: int, answer_len: int, replicas: int, price_per_gpu_hour: float | None
) -> None:
    """Refuse, naming the fix, lengths that are not whole tokens or overrun the model's context, a fleet of no
    replicas and a negative price."""
    for name, value in (("prompt_len", prompt_len), ("answer_len", answer_len)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be a whole number of tokens, 1 or more; got {value!r}")
    if model.context_length is not None and prompt_len + answer_len > model.context_length:
        raise ValueError(
            f"{model.name} reads at most {model.context_length:,} tokens (its context length); a prompt of "
            f"{prompt_len:,} and an answer of {answer_len:,} make {prompt_len + answer_len:,}: shorten them "
            "or pick a model with a longer context"
        )
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas must be a whole number, 1 or more; got {replicas!r}")
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise ValueError(f"price_per_gpu_hour must be zero or more, got {price_per_gpu_hour!r}")


def _memory_fields(
    cost: CostModel, model: ModelSpec, split: TensorSplit, usable_bytes: float, conversations: int, tokens: int
) -> dict:
    """What one GPU holds and reads: the plan's bytes, and the conversations they leave room for."""
    shard = split.shard
    return dict(
        weight_bytes_per_gpu=shard.weight_bytes,
        kv_bytes_per_token_per_gpu=shard.kv_bytes_per_token,
        kv_budget_bytes=usable_bytes - shard.weight_bytes,
        kv_bytes_per_conversation=shard.kv_bytes(tokens),
        conversations=conversations,
        single_stream_tokens_per_s=cost.single_stream_bound,
        critical_batch=cost.critical_batch,
        decode_weight_read_bytes_per_gpu=cost.weight_bytes_read(conversations),
        experts_touched=(
            expected_distinct_experts(conversations, model.experts, model.experts_per_token) if model.is_moe else None
        ),
    )


def _time_fields(
    cost: CostModel, model: ModelSpec, split: TensorSplit, conversations: int, prompt_len: int, answer_len: int
) -> dict:
    """How long a full batch's decode step and one prefill take, and what they make per request and per second."""
    mean_context = prompt_len + answer_len / 2
    windowed_context = mean_context if model.sliding_window is None else min(mean_context, model.sliding_window)
    step = cost.pass_breakdown(conversations, conversations * mean_context, conversations * windowed_context)
    decode_allreduce_s = split.allreduce_s_per_token * conversations
    decode_step_s = step.total_s + decode_allreduce_s
    prefill_attention_s = _prefill_attention_s(split.shard, prompt_len, cost.flops)
    prefill_s = _prefill_s(cost, prompt_len, prefill_attention_s, split.allreduce_s_per_token)
    decode_s_per_request = answer_len * decode_step_s / conversations
    gpu_s_per_request = prefill_s + decode_s_per_request
    decode_share = decode_s_per_request / gpu_s_per_request
    ceiling = 1 / gpu_s_per_request
    return dict(
        mean_context=mean_context,
        decode_memory_s=step.memory_s,
        decode_compute_s=step.compute_s,
        decode_allreduce_s=decode_allreduce_s,
        decode_step_s=decode_step_s,
        prefill_attention_s=prefill_attention_s,
        prefill_s=prefill_s,
        decode_s_per_request=decode_s_per_request,
        gpu_s_per_request=gpu_s_per_request,
        request_ceiling_per_s=ceiling,
        tokens_per_s=ceiling * answer_len,
        decode_share=decode_share,
        token_interval_s=decode_step_s / decode_share,
    )


def _prefill_s(cost: CostModel, prompt_len: int, attention_s: float | None, allreduce_s_per_token: float) -> float:
    """One prompt's prefill, attention's own arithmetic included.

    Attention's arithmetic (``ModelSpec.prefill_attention_flops``) is quadratic in the prompt: 2% of a 1,000-token
    prompt's arithmetic for Llama 3.1 8B, 62% of a 100,000-token one. Decode steps leave it out: per token it is
    4 x layers x query_heads x head_dim x context FLOPs, read alongside the same context's KV bytes at query_heads /
    kv_heads FLOPs per byte (4 for Llama 3.1 8B), far below any GPU's arithmetic-to-bandwidth ratio, so the KV read
    covers it.
    """
    prefill = cost.pass_breakdown(prompt_len, 0)
    arithmetic_s = prefill.compute_s + (attention_s or 0.0)
    return max(prefill.memory_s, arithmetic_s) + prefill.overhead_s + allreduce_s_per_token * prompt_len


def _promise_fields(
    cost: CostModel, times: dict, answer_len: int, promise_s: float | None, allreduce_s: float, conversations: int
) -> dict:
    """The load that keeps the promise about time per token and the conversations then in flight (None without
    a promise); memory's limit when the promise does not bind first."""
    promise_load = in_flight = None
    if promise_s is not None:
        promise_load, in_flight = load_within_promise(
            cost, times["prefill_s"], answer_len, times["mean_context"], promise_s, allreduce_s_per_token=allreduce_s
        )
        if in_flight >= conversations:  # the promise does not bind before memory does
            promise_load, in_flight = times["request_ceiling_per_s"], float(conversations)
    return dict(promise_s=promise_s, promise_load_per_s=promise_load, promise_in_flight=in_flight)


def _prefill_attention_s(shard: ModelSpec, prompt_len: int, flops: float) -> float | None:
    """Seconds of attention arithmetic in one GPU's share of a prefill; None when the model names no heads."""
    return None if shard.query_heads is None else shard.prefill_attention_flops(prompt_len) / flops


def _conversations_that_fit(
    gpu_memory: float, memory_fraction: float, model: ModelSpec, split: TensorSplit, tokens: int
) -> int:
    """Conversations per replica: as many as fit on each of its GPUs, or an error that names the fix."""
    if 0 < memory_fraction <= 1 and split.shard.weight_bytes >= gpu_memory * memory_fraction:
        raise ValueError(does_not_fit(gpu_memory, memory_fraction, model, split, tokens))
    conversations = conversations_that_fit(gpu_memory, memory_fraction, split.shard, tokens)  # checks the inputs
    if conversations < 1:
        raise ValueError(does_not_fit(gpu_memory, memory_fraction, model, split, tokens))
    return conversations
