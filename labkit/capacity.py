"""Napkin capacity planning: how many users one GPU serves, and what a million tokens costs.

Memory decides how many conversations fit (one subtraction, one division); the cost
model decides how long a decode step and a prefill take; the rest is bookkeeping:
GPU time per request, the request ceiling, tokens per second, the price, and the load
that keeps a promise about time per token. Every number is a model output, not a
measurement: it shows which resource binds, then a benchmark has the last word.

``SALE_EXAMPLE`` and ``FRIENDS_EXAMPLE`` rebuild the two worked examples of the course's
sources, whose tables were not published, from the numbers the texts quote.

Past one GPU, ``plan(..., tensor_parallel=N, replicas=R)`` splits each replica's model N ways
(:mod:`labkit.capacity_parallel` holds the split and its all-reduces) and runs R replicas
side by side; :func:`size_fleet` searches N and R for the fewest GPUs that carry a load
within the promise (the 10x sale: ``size_fleet(sale_load(10), **SALE_70B_EXAMPLE)``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from labkit.capacity_parallel import LLAMA_3_1_70B, TensorSplit, does_not_fit, tensor_split
from labkit.sim.cost_model import MODELS, CostModel, ModelSpec, conversations_that_fit, get_model
from labkit.sim.hardware import GB, TB, TFLOPS, Hardware, get_hardware
from labkit.sim.speculation import (  # noqa: F401  (the planner's speculation figures live here too)
    SpeculationPoint,
    format_speculation,
    speculation_breakeven_batch,
    speculative_speedup,
)

# The lessons say "8B" and compute with 8.0e9 parameters (16 GB of BF16 weights); the real
# checkpoint holds 8.03e9. Their figures are reproduced only with the round number.
LESSON_LLAMA_8B = replace(MODELS["llama-3.1-8b"], name="Llama 3.1 8B (round 8e9 parameters)", parameters=8e9)

SALE_GPU = Hardware(
    "the sale's GPU (A100-class, round figures)",
    80 * GB,
    2 * TB,
    150 * TFLOPS,
    "reconstructed from seed 000: 2 TB/s is quoted; 150 TFLOP/s gives both its critical batch of 75 "
    "and its 35.0 ms arithmetic term; about half the A100's 312 TFLOP/s peak, a rate kernels reach; "
    "NVLink as the A100's, 300 GB/s each way",
    interconnect_bandwidth=300 * GB,
)

SALE_EXAMPLE: dict = dict(
    hardware=SALE_GPU,
    model=LESSON_LLAMA_8B,
    prompt_len=1000,
    answer_len=300,
    memory_fraction=0.9,
    overhead_s=0.003,
    promise_s=0.050,
    price_per_gpu_hour=2.0,
)
"""The festival-sale plan of seed 000 ("Capacity planning, by hand"), rebuilt from its quotes.

Inputs and the quotes that pin them: 80 GB card at 90% (72 GB, less 16 GB of weights,
leaves 56 GB); 1,000-token prompt and 300-token answer (1,300 tokens x 128 KiB per
conversation: 328 fit; mean context 1,000 + 300/2 = 1,150 tokens); 2 TB/s and 150 TFLOP/s
(memory term 32.7 ms, arithmetic 35.0 ms, critical batch 75); 3 ms overhead per pass
(step 38.0 ms; prefill 109.7 ms, so 144.4 ms of GPU time per request of which 34.7 ms is
decode). Outputs then match every quote: 125 tokens/s for one stream, about 17x that in
total, 24% decode share, 158 ms between a user's tokens, a 6.9 requests/s ceiling, and
under a 50 ms promise 5.9 requests/s with 88 conversations in flight, about 15% lost.
The price, $2.00 per GPU-hour, is our assumption: the source quotes no price.
"""

SALE_70B_EXAMPLE: dict = dict(SALE_EXAMPLE, model=LLAMA_3_1_70B)
"""The sale with a bot ten times the size: Llama 3.1 70B on the same cards. Its 141 GB of bf16
weights fit no single card, so it must be split (``tensor_parallel``) or quantized."""


def sale_load(multiple: float = 10.0) -> float:
    """Requests/s of a sale bringing ``multiple`` times the usual traffic.

    The sources quote "ten times the usual number of chats" but not the usual number; we take
    it to be what one card of :data:`SALE_EXAMPLE` carries within its promise (5.9 requests/s),
    the traffic the bot serves on an ordinary day.
    """
    if not multiple > 0:
        raise ValueError(f"multiple must be positive, got {multiple!r}; 10 for a sale of ten times the usual")
    return multiple * plan(**SALE_EXAMPLE).promise_load_per_s


FRIENDS_GPU = Hardware(
    "the post's 24 GB card (close to an RTX 4090)",
    24 * GB,
    1 * TB,
    165 * TFLOPS,
    "seed 002: 'about 1 TB/s of memory bandwidth and 165 TFLOPS'",
)

FRIENDS_EXAMPLE: dict = dict(
    hardware=FRIENDS_GPU, model=LESSON_LLAMA_8B, prompt_len=6144, answer_len=2048, memory_fraction=0.85
)
"""Seed 002's Llama 3.1 8B on a 24 GB card, friends chatting at 8K tokens each.

Quoted: 16 GB of weights; 128 KiB of KV per token, about 1 GB for an 8K chat; four friends
at 8K fit and ten do not; about 60 tokens/s for one person (62.5); a 2,000-token prompt is
compute-bound (critical batch 165). The post does not say how much of the card it keeps
back for activations: 85% is the roundest fraction that fits four (any from 85% to 89% does).
The 6,144 + 2,048 split of the 8K chat is ours; only the total is quoted. The step figures
are cost-model calls on this card with no overhead: an 8K document prefills in about 800 ms;
nine friends decoding at 2K contexts take 18 ms a step, 26 ms with a 256-token chunk of the
document riding along (the chunk size is ours: 256 is the size that gives 26); ten friends at
2K get 54 tokens/s each, almost nine times one stream's total.
"""


# Bytes per weight of each storage scheme, scales included: int8 keeps one fp16 scale per row
# (negligible), 4-bit adds an fp16 scale and a zero per 128 weights (0.5 + 3/128, seed 000's
# "about 0.52"); labkit.models.quant stores them so.
WEIGHT_BYTES = {"bf16": 2.0, "fp16": 2.0, "int8": 1.0, "int4": 0.52}
# Bytes per cached key or value: vLLM's --kv-cache-dtype fp8 halves the 16-bit cache.
KV_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}


# The planner's models: the simulator's presets and the one that needs several GPUs.
PLANNER_MODELS: dict[str, ModelSpec] = {**MODELS, "llama-3.1-70b": LLAMA_3_1_70B}


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
    changes, labels = {}, []
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
    if not changes:
        return model
    return replace(model, name=f"{model.name} ({', '.join(labels)})", **changes)


@dataclass(frozen=True)
class CapacityPlan:
    """Everything :func:`plan` works out; ``str()`` gives the table, numbered as in the lesson.

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
    kv_bytes_per_conversation: float  # (prompt + answer) x KV bytes per token, per GPU
    conversations: int  # per replica
    # Part 2: how fast, and how much
    single_stream_tokens_per_s: float  # bandwidth / weight bytes
    critical_batch: float  # tokens per pass where arithmetic time = weight-read time
    mean_context: float  # prompt + answer / 2: the average sequence in a full batch
    decode_memory_s: float
    decode_compute_s: float
    overhead_s: float
    decode_allreduce_s: float  # the GPUs of a replica adding up their partial results; 0 on one GPU
    decode_step_s: float
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
        """KV cache a full decode step reads: conversations x mean context x KV bytes per token."""
        return self.conversations * self.mean_context * self.model.kv_bytes_per_token

    @property
    def kv_read_bytes_per_gpu(self) -> float:
        """The share of :attr:`kv_read_bytes` that each GPU of a replica reads."""
        return self.conversations * self.mean_context * self.kv_bytes_per_token_per_gpu

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

    def __str__(self) -> str:
        m, ms, n = self.model, 1e3, self.tensor_parallel
        tokens = self.prompt_len + self.answer_len
        split = n > 1
        per_gpu = ", per GPU" if split else ""
        kv_heads = round(m.kv_heads * self.kv_bytes_per_token_per_gpu / m.kv_bytes_per_token)  # on each GPU
        fleet = "" if self.gpus == 1 else f" ({self.replicas:,} x {n} GPU{'s' if split else ''})"
        rows = [
            f"Capacity plan: {m.name} on {self.hardware.name}{fleet}",
            "(napkin estimate from the four-constant cost model, not a measurement)",
            "",
            "Part 1: how many conversations fit",
            _row(
                1,
                "usable memory",
                f"{self.gpu_memory_bytes / GB:,.0f} GB x {self.memory_fraction:.2f}",
                f"{self.gpu_memory_bytes * self.memory_fraction / GB:,.1f} GB",
            ),
            _row(
                2,
                "left for KV caches" + per_gpu,
                f"minus {self.weight_bytes_per_gpu / GB:,.1f} GB of weights" + (f" (1/{n})" if split else ""),
                f"{self.kv_budget_bytes / GB:,.1f} GB",
            ),
            _row(
                3,
                "KV per token" + per_gpu,
                f"2 x {m.layers} x {kv_heads} x {m.head_dim} x {m.kv_bytes_per_value:g} B"
                + (f" ({kv_heads} of {m.kv_heads} heads)" if split else ""),
                f"{self.kv_bytes_per_token_per_gpu / 1024:,.0f} KiB",
            ),
            _row(
                4,
                "KV per conversation" + per_gpu,
                f"{tokens:,} tokens",
                f"{self.kv_bytes_per_conversation / 1e6:,.0f} MB",
            ),
            _row(5, "conversations that fit", "row 2 / row 4, rounded down", f"{self.conversations:,}"),
            "",
            "Part 2: how fast, and how much",
            _row(6, "decode step, all on board", f"mean context {self.mean_context:,.0f} tokens", ""),
            _row(
                "",
                "  memory term" + per_gpu,
                f"({self.weight_bytes_per_gpu / GB:,.1f} + {self.kv_read_bytes_per_gpu / GB:,.1f} GB KV) / "
                f"{self.hardware.bandwidth / TB:.3g} TB/s",
                f"{self.decode_memory_s * ms:.1f} ms",
            ),
            _row(
                "",
                "  arithmetic term" + per_gpu,
                f"{self.conversations:,} x 2 x {m.parameters / 1e9:.3g}e9"
                + (f" / {n}" if split else "")
                + f" / {self.hardware.flops / TFLOPS:.3g} TFLOP/s",
                f"{self.decode_compute_s * ms:.1f} ms",
            ),
            *self._allreduce_rows(),
            _row(
                "",
                "  step",
                f"the larger + {self.overhead_s * ms:.1f} ms overhead" + (" + all-reduce" if split else ""),
                f"{self.decode_step_s * ms:.1f} ms",
            ),
            _row(7, "prefill", f"{self.prompt_len:,} tokens", f"{self.prefill_s * ms:.1f} ms"),
            _row(
                8,
                "GPU time per request",
                f"prefill + {self.answer_len:,} x step / {self.conversations:,}",
                f"{self.gpu_s_per_request * ms:.1f} ms",
            ),
            _row(9, "request ceiling", "1 / row 8", f"{_rate(self.request_ceiling_per_s)} req/s"),
            _row(10, "output tokens/s", f"row 9 x {self.answer_len:,}", f"{self.tokens_per_s:,.0f}"),
            _row(11, "cost per million tokens", self._price_formula(), self._price_value()),
            _row(
                "",
                "single-stream bound",
                "bandwidth / weight bytes" + per_gpu,
                f"{self.single_stream_tokens_per_s:,.1f} tok/s",
            ),
            _row("", "batching buys", "row 10 / single stream", f"{self.speedup_over_single_stream:.1f}x"),
            _row("", "critical batch", "flops / bandwidth x bytes per param / 2", f"{self.critical_batch:,.0f} tokens"),
            "",
            "Part 3: the promise to users",
            _row(
                "",
                "decode share of GPU time",
                f"{self.decode_s_per_request * ms:.1f} / {self.gpu_s_per_request * ms:.1f} ms",
                f"{self.decode_share:.0%}",
            ),
            _row("", "time between a user's tokens", "step / decode share", f"{self.token_interval_s * ms:.0f} ms"),
        ]
        if self.promise_s is not None:
            rows += [
                _row(
                    "",
                    "load that keeps the promise",
                    f"a token every {self.promise_s * ms:.0f} ms or sooner",
                    f"{_rate(self.promise_load_per_s)} req/s",
                ),
                _row("", "conversations in flight", "load x answer x promise", f"{self.promise_in_flight:,.0f}"),
                _row("", "capacity the promise costs", "1 - load / ceiling", f"{self.promise_capacity_cost:.0%}"),
            ]
        if self.gpus > 1:
            rows += ["", f"Part 4: the fleet, {self.replicas:,} replica(s) of {n} GPU(s)", *self._fleet_rows()]
        return "\n".join(rows)

    def _allreduce_rows(self) -> list[str]:
        if self.tensor_parallel == 1:
            return []
        n = self.tensor_parallel
        return [
            _row(
                "",
                "  all-reduce",
                f"{self.model.layers} x 2 x 2({n}-1)/{n} x {self.conversations:,} x {self.hidden_size:,} x 2 B "
                f"/ {self.hardware.interconnect_bandwidth / GB:,.0f} GB/s",
                f"{self.decode_allreduce_s * 1e3:.2f} ms",
            )
        ]

    def _fleet_rows(self) -> list[str]:
        r = self.replicas
        rows = [
            _row("", "GPUs", f"{r:,} x {self.tensor_parallel}", f"{self.gpus:,}"),
            _row("", "request ceiling", f"{r:,} x row 9", f"{_rate(self.fleet_request_ceiling_per_s)} req/s"),
            _row("", "output tokens/s", f"{r:,} x row 10", f"{self.fleet_tokens_per_s:,.0f}"),
        ]
        if self.promise_s is not None:
            rows.append(
                _row(
                    "",
                    "load that keeps the promise",
                    f"{r:,} x the replica's",
                    f"{_rate(self.fleet_promise_load_per_s)} req/s",
                )
            )
        return rows

    def _price_formula(self) -> str:
        if self.price_per_gpu_hour is None:
            return "no price given"
        gpus = "" if self.tensor_parallel == 1 else f" x {self.tensor_parallel}"
        return f"${self.price_per_gpu_hour:.2f}/h{gpus} / 3600 / row 10 x 1e6"

    def _price_value(self) -> str:
        return "-" if self.cost_per_million_tokens is None else f"${self.cost_per_million_tokens:.3f}"


def _rate(per_s: float) -> str:
    return f"{per_s:,.1f}" if per_s >= 1 else f"{per_s:.2g}"


def _row(number: int | str, label: str, formula: str, value: str) -> str:
    return f"{number!s:>3}  {label:<30} {formula:<46} {value:>14}"


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
    """
    if not promise_s > 0:
        raise ValueError(f"promise_s must be positive, got {promise_s!r}; for 50 ms between tokens pass 0.050")
    weight_read_s = cost.weight_bytes / cost.bandwidth
    if promise_s <= weight_read_s + cost.overhead_s:
        raise ValueError(
            f"no load keeps a promise of {promise_s * 1e3:.1f} ms per token: a decode step already "
            f"takes {(weight_read_s + cost.overhead_s) * 1e3:.1f} ms to read the weights; promise "
            "more, or use more bandwidth or fewer bytes per parameter"
        )
    kv_s_per_sequence = mean_context * cost.kv_bytes_per_token / cost.bandwidth + allreduce_s_per_token
    compute_s_per_sequence = cost.flops_per_token / cost.flops + allreduce_s_per_token
    memory_bound = (promise_s - weight_read_s - cost.overhead_s) / (
        answer_len * promise_s * kv_s_per_sequence + promise_s * prefill_s
    )
    compute_bound = (promise_s - cost.overhead_s) / (
        answer_len * promise_s * compute_s_per_sequence + promise_s * prefill_s
    )
    load = min(memory_bound, compute_bound)
    return load, load * answer_len * promise_s


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
) -> CapacityPlan:
    """Plan GPUs serving conversations of ``prompt_len`` + ``answer_len`` tokens: one, or a fleet.

    ``hardware`` and ``model`` are presets or their names; ``gpu_memory_bytes`` overrides the
    card's memory. Times are in seconds (``promise_s=0.050`` for a token every 50 ms); the
    price is per GPU-hour. The batch is assumed full: every conversation that fits is on
    board, the average one halfway through its answer. See :func:`load_within_promise` for
    the algebra of the promise. ``plan(**SALE_EXAMPLE)`` is the lesson's worked example.

    ``tensor_parallel=N`` splits each replica over N GPUs of a node (weights, KV heads and
    arithmetic N ways, plus the all-reduces of :mod:`labkit.capacity_parallel`, which need the
    card's ``interconnect_bandwidth`` and the model's ``hidden_size``); ``replicas=R`` runs R
    such copies behind a router, so the fleet serves R times one replica.
    """
    hardware, model = get_hardware(hardware), planner_model(model)
    for name, value in (("prompt_len", prompt_len), ("answer_len", answer_len)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name} must be a whole number of tokens, 1 or more; got {value!r}")
    if not (isinstance(replicas, int) and replicas >= 1):
        raise ValueError(f"replicas must be a whole number, 1 or more; got {replicas!r}")
    if price_per_gpu_hour is not None and price_per_gpu_hour < 0:
        raise ValueError(f"price_per_gpu_hour must be zero or more, got {price_per_gpu_hour!r}")
    gpu_memory = hardware.memory_bytes if gpu_memory_bytes is None else gpu_memory_bytes
    split = tensor_split(hardware, model, tensor_parallel, hidden_size)
    shard, allreduce_s = split.shard, split.allreduce_s_per_token  # what one GPU holds; talk per token
    cost = CostModel.from_parts(hardware, shard, overhead_s)
    conversations = _conversations_that_fit(gpu_memory, memory_fraction, model, split, prompt_len + answer_len)

    mean_context = prompt_len + answer_len / 2
    step = cost.pass_breakdown(conversations, conversations * mean_context)
    decode_allreduce_s = allreduce_s * conversations
    decode_step_s = step.total_s + decode_allreduce_s
    prefill_s = cost.prefill_time(prompt_len) + allreduce_s * prompt_len
    decode_s_per_request = answer_len * decode_step_s / conversations
    gpu_s_per_request = prefill_s + decode_s_per_request
    ceiling = 1 / gpu_s_per_request
    tokens_per_s = ceiling * answer_len
    decode_share = decode_s_per_request / gpu_s_per_request
    price = None if price_per_gpu_hour is None else price_per_gpu_hour * tensor_parallel

    promise_load = in_flight = None
    if promise_s is not None:
        promise_load, in_flight = load_within_promise(
            cost, prefill_s, answer_len, mean_context, promise_s, allreduce_s_per_token=allreduce_s
        )
        if in_flight >= conversations:  # the promise does not bind before memory does
            promise_load, in_flight = ceiling, float(conversations)

    return CapacityPlan(
        hardware=hardware,
        model=model,
        prompt_len=prompt_len,
        answer_len=answer_len,
        memory_fraction=memory_fraction,
        gpu_memory_bytes=gpu_memory,
        tensor_parallel=tensor_parallel,
        replicas=replicas,
        hidden_size=split.hidden_size,
        weight_bytes_per_gpu=shard.weight_bytes,
        kv_bytes_per_token_per_gpu=shard.kv_bytes_per_token,
        kv_budget_bytes=gpu_memory * memory_fraction - shard.weight_bytes,
        kv_bytes_per_conversation=(prompt_len + answer_len) * shard.kv_bytes_per_token,
        conversations=conversations,
        single_stream_tokens_per_s=cost.single_stream_bound,
        critical_batch=cost.critical_batch,
        mean_context=mean_context,
        decode_memory_s=step.memory_s,
        decode_compute_s=step.compute_s,
        overhead_s=overhead_s,
        decode_allreduce_s=decode_allreduce_s,
        decode_step_s=decode_step_s,
        prefill_s=prefill_s,
        decode_s_per_request=decode_s_per_request,
        gpu_s_per_request=gpu_s_per_request,
        request_ceiling_per_s=ceiling,
        tokens_per_s=tokens_per_s,
        cost_per_million_tokens=None if price is None else price / 3600 / tokens_per_s * 1e6,
        price_per_gpu_hour=price_per_gpu_hour,
        decode_share=decode_share,
        token_interval_s=decode_step_s / decode_share,
        promise_s=promise_s,
        promise_load_per_s=promise_load,
        promise_in_flight=in_flight,
    )


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


@dataclass(frozen=True)
class FleetOption:
    """One tensor-parallel size tried by :func:`size_fleet`: its replica plan and how many replicas, or why not."""

    tensor_parallel: int
    replicas: int | None = None
    plan: CapacityPlan | None = None  # of the fleet: one replica's figures, and the fleet's totals
    why_not: str = ""

    @property
    def gpus(self) -> int | None:
        return None if self.replicas is None else self.tensor_parallel * self.replicas


@dataclass(frozen=True)
class FleetSizing:
    """The fewest GPUs that carry ``load_per_s`` within the promise, and every split that was tried."""

    load_per_s: float
    options: tuple[FleetOption, ...]

    @property
    def best(self) -> FleetOption:
        """The option with the fewest GPUs; of equals, the one with the most spare load."""
        fitting = [o for o in self.options if o.replicas is not None]
        return min(fitting, key=lambda o: (o.gpus, -_replica_load(o.plan) * o.replicas))

    def to_dict(self) -> dict:
        return {
            "load_per_s": self.load_per_s,
            "best": {"tensor_parallel": self.best.tensor_parallel, "replicas": self.best.replicas},
            "options": [
                {
                    "tensor_parallel": o.tensor_parallel,
                    "replicas": o.replicas,
                    "gpus": o.gpus,
                    "why_not": o.why_not,
                    "plan": None if o.plan is None else o.plan.to_dict(),
                }
                for o in self.options
            ],
        }

    def __str__(self) -> str:
        example = next(o.plan for o in self.options if o.plan is not None)
        kept = "within the promise" if example.promise_s is not None else "at the request ceiling"
        rows = [
            f"Fleet for {_rate(self.load_per_s)} requests/s {kept}: {example.model.name} on {example.hardware.name}",
            "(napkin estimate from the cost model, not a measurement)",
            "",
            f"{'GPUs per replica':>16}  {'load per replica':>18}  {'in flight':>9}  {'replicas':>8}  {'GPUs':>5}  note",
        ]
        for o in self.options:
            if o.plan is None:
                rows.append(f"{o.tensor_parallel:>16}  {'-':>18}  {'-':>9}  {'-':>8}  {'-':>5}  {o.why_not}")
                continue
            note = "fewest GPUs" if o is self.best else ""
            in_flight = o.plan.conversations if o.plan.promise_in_flight is None else o.plan.promise_in_flight
            rows.append(
                f"{o.tensor_parallel:>16}  {_rate(_replica_load(o.plan)) + ' req/s':>18}  {in_flight:>9,.0f}  "
                f"{o.replicas:>8,}  {o.gpus:>5,}  {note}"
            )
        return "\n".join(rows)


def _replica_load(replica: CapacityPlan) -> float:
    """What one replica carries: the load within the promise, or the request ceiling without one."""
    return replica.request_ceiling_per_s if replica.promise_load_per_s is None else replica.promise_load_per_s


def size_fleet(
    load_per_s: float,
    hardware: Hardware | str,
    model: ModelSpec | str,
    prompt_len: int,
    answer_len: int,
    *,
    tensor_parallel: tuple[int, ...] = (1, 2, 4, 8),
    **settings,
) -> FleetSizing:
    """How many GPUs carry ``load_per_s`` requests/s: for each tensor-parallel size, the replicas needed.

    Each size N gets R = ceil(load / what one replica carries) replicas (within ``promise_s`` if
    given, else at the request ceiling); a size at which the model does not fit is listed with
    the reason. ``settings`` are :func:`plan`'s keywords. The 10x sale of the 70B bot under its
    50 ms promise: ``size_fleet(sale_load(10), **SALE_70B_EXAMPLE).best``.
    """
    if not load_per_s > 0:
        raise ValueError(f"load_per_s must be positive, got {load_per_s!r}; e.g. sale_load(10) for the 10x sale")
    if "replicas" in settings:
        raise ValueError("size_fleet chooses the replicas; drop replicas=")
    options = []
    for ways in tensor_parallel:
        try:
            replica = plan(hardware, model, prompt_len, answer_len, tensor_parallel=ways, **settings)
        except ValueError as error:
            options.append(FleetOption(ways, why_not=str(error)))
            continue
        replicas = max(1, math.ceil(load_per_s / _replica_load(replica) - 1e-9))  # 1e-9: 10 x 5.9 / 5.9 is 10
        options.append(FleetOption(ways, replicas, replace(replica, replicas=replicas)))
    if all(o.plan is None for o in options):
        raise ValueError(
            f"no tensor-parallel size of {tuple(tensor_parallel)} fits the model; the first reason: "
            f"{options[0].why_not}"
        )
    return FleetSizing(load_per_s, tuple(options))
