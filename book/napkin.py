"""The handful of serving formulas that several book chapters plot.

Why this file exists: the chapters share one cost model (four constants: memory
bandwidth, arithmetic rate, weight bytes, a fixed overhead per pass) and one
napkin capacity planner. Keeping them here means every figure uses the same
arithmetic. labkit's own cost model and planner are meant to replace this file;
the numbers must agree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

GB = 1e9
TB = 1e12


@dataclass(frozen=True)
class Accelerator:
    """Datasheet figures of one chip: memory size, memory bandwidth, dense 16-bit arithmetic."""

    name: str
    memory_bytes: float
    bandwidth: float  # bytes per second
    flops: float  # floating-point operations per second

    @property
    def critical_intensity(self) -> float:
        """FLOPs per byte at which moving bytes and doing arithmetic take equally long."""
        return self.flops / self.bandwidth


# Rounded vendor datasheet peaks (dense 16-bit tensor throughput, HBM bandwidth).
A100 = Accelerator("A100 80GB", 80 * GB, 2.0 * TB, 312e12)
H100 = Accelerator("H100 SXM", 80 * GB, 3.35 * TB, 989e12)
H200 = Accelerator("H200", 141 * GB, 4.8 * TB, 989e12)
B200 = Accelerator("B200", 180 * GB, 8.0 * TB, 2250e12)
RTX4090 = Accelerator("RTX 4090", 24 * GB, 1.0 * TB, 165e12)
DATACENTRE_PARTS = (A100, H100, H200, B200)


@dataclass(frozen=True)
class Model:
    """What serving needs to know about a decoder-only transformer."""

    name: str
    params: float
    bytes_per_param: float
    layers: int
    kv_heads: int
    head_dim: int
    kv_bytes_per_value: float = 2.0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.bytes_per_param

    @property
    def kv_bytes_per_token(self) -> float:
        """Keys and values for one token in every layer: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_value


LLAMA_8B = Model("Llama 3.1 8B (16-bit)", 8.0e9, 2.0, 32, 8, 128)
SMOLLM2_135M = Model("SmolLM2-135M (fp32)", 134.5e6, 4.0, 30, 3, 64, 4.0)


def single_stream_bound(model: Model, bandwidth: float) -> float:
    """Upper bound on tokens per second for one sequence: every weight crosses the memory link once per token."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth}; pass bytes per second")
    return bandwidth / model.weight_bytes


def step_time(
    model: Model,
    bandwidth: float,
    flops: float,
    tokens: float,
    kv_tokens_read: float,
    overhead: float = 0.0,
) -> float:
    """Seconds for one forward pass: the slower of moving bytes and doing arithmetic, plus a fixed overhead.

    `tokens` is how many tokens the pass computes (the batch size for decode, the
    prompt length for prefill); `kv_tokens_read` is how many cached tokens it reads.
    """
    move = (model.weight_bytes + kv_tokens_read * model.kv_bytes_per_token) / bandwidth
    compute = tokens * 2 * model.params / flops
    return np.maximum(move, compute) + overhead


@dataclass(frozen=True)
class Plan:
    """Every number of the napkin capacity plan, in SI units (seconds, bytes)."""

    conversations: int
    single_stream_tps: float
    critical_batch: float
    decode_memory_s: float
    decode_compute_s: float
    decode_step_s: float
    prefill_s: float
    gpu_s_per_request: float
    decode_share: float
    token_interval_s: float
    ceiling_rps: float
    output_tps: float
    promise_rps: float | None
    promise_in_flight: float | None


def plan(
    model: Model,
    memory_bytes: float,
    bandwidth: float,
    flops: float,
    prompt: int,
    answer: int,
    memory_fraction: float = 0.9,
    overhead: float = 0.0,
    interval_promise: float | None = None,
) -> Plan:
    """The napkin capacity plan: how many conversations fit, how fast they go, what a promise costs.

    The promise algebra: with arrival rate r, prefills take the share r x prefill of
    the GPU's time, so a user sees a token every step(B) / (1 - r x prefill). By
    Little's law the conversations in flight are B = r x answer x interval. Holding
    the interval at the promise p gives one equation in r,
    step(r x answer x p) = p x (1 - r x prefill), solved here by bisection.
    """
    if prompt < 0 or answer <= 0:
        raise ValueError(f"prompt must be >= 0 and answer > 0 tokens, got {prompt} and {answer}")
    kv_budget = memory_bytes * memory_fraction - model.weight_bytes
    if kv_budget <= 0:
        raise ValueError(
            f"{model.name} needs {model.weight_bytes / GB:.1f} GB of weights but only "
            f"{memory_bytes * memory_fraction / GB:.1f} GB is usable: pick a bigger GPU or fewer bytes per weight"
        )
    per_conversation = (prompt + answer) * model.kv_bytes_per_token
    fits = int(kv_budget // per_conversation)
    mean_context = prompt + answer / 2

    def decode_step(batch: float) -> float:
        return float(step_time(model, bandwidth, flops, batch, batch * mean_context, overhead))

    decode_memory = (model.weight_bytes + fits * mean_context * model.kv_bytes_per_token) / bandwidth
    decode_compute = fits * 2 * model.params / flops
    decode = decode_step(fits)
    prefill = float(step_time(model, bandwidth, flops, prompt, 0, overhead))
    decode_per_request = answer * decode / fits
    per_request = prefill + decode_per_request
    share = decode_per_request / per_request

    promise_rps = promise_in_flight = None
    if interval_promise is not None:
        low, high = 0.0, 1.0 / prefill
        for _ in range(100):
            rate = (low + high) / 2
            if decode_step(rate * answer * interval_promise) > interval_promise * (1 - rate * prefill):
                high = rate
            else:
                low = rate
        promise_rps, promise_in_flight = low, low * answer * interval_promise

    return Plan(
        conversations=fits,
        single_stream_tps=single_stream_bound(model, bandwidth),
        critical_batch=flops / bandwidth * model.bytes_per_param / 2,
        decode_memory_s=decode_memory,
        decode_compute_s=decode_compute,
        decode_step_s=decode,
        prefill_s=prefill,
        gpu_s_per_request=per_request,
        decode_share=share,
        token_interval_s=decode / share,
        ceiling_rps=1 / per_request,
        output_tps=answer / per_request,
        promise_rps=promise_rps,
        promise_in_flight=promise_in_flight,
    )


def measure_this_machine(copy_mb: int = 128, matmul_n: int = 768, repeats: int = 5) -> Accelerator:
    """Probe the machine building the book: a large array copy for bandwidth, a float32 matmul for arithmetic."""
    source = np.ones(copy_mb * 2**20 // 8)
    target = np.empty_like(source)
    copy_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(target, source)
        copy_times.append(time.perf_counter() - start)
    bandwidth = 2 * source.nbytes / float(np.median(copy_times))  # one read and one write per byte

    a = np.random.default_rng(0).standard_normal((matmul_n, matmul_n), dtype=np.float32)
    matmul_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        a @ a
        matmul_times.append(time.perf_counter() - start)
    flops = 2 * matmul_n**3 / float(np.median(matmul_times))
    return Accelerator("this machine (CPU, measured)", 0.0, bandwidth, flops)


@dataclass
class Workload:
    """Requests of a sale: arrival times (s), prompt and answer lengths (tokens)."""

    arrivals: np.ndarray
    prompts: np.ndarray
    answers: np.ndarray


def sale_workload(rate: float, seconds: float, seed: int = 0, prompt_median: int = 300, answer_median: int = 120) -> Workload:
    """Poisson arrivals with skewed (log-normal) lengths: most answers short, a few very long."""
    rng = np.random.default_rng(seed)
    count = rng.poisson(rate * seconds)
    arrivals = np.sort(rng.uniform(0, seconds, count))
    prompts = np.clip(rng.lognormal(np.log(prompt_median), 0.8, count), 16, 4000).astype(int)
    answers = np.clip(rng.lognormal(np.log(answer_median), 1.0, count), 4, 1500).astype(int)
    return Workload(arrivals, prompts, answers)


@dataclass
class Outcome:
    """What a simulated run produced, per request and per step."""

    first_token: np.ndarray  # time of each request's first token
    finish: np.ndarray  # time of each request's last token
    token_times: list[list[float]]  # every token's time, per request
    step_end: list[float]  # end time of every pass
    step_kind: list[str]  # "prefill", "decode" or "mixed"
    padded_slot_steps: int
    used_slot_steps: int


def simulate(
    work: Workload,
    model: Model,
    chip: Accelerator,
    policy: str = "continuous",
    max_batch: int = 64,
    chunk_budget: int | None = None,
    overhead: float = 0.003,
) -> Outcome:
    """Drive a toy scheduler with cost-model time (no model runs).

    policy "static": a batch is formed from whoever waits, runs until its longest
    answer ends, and finished slots are padded. "continuous": finished sequences
    leave after every pass and waiting ones join while slots are free. With
    chunk_budget, each pass carries every decode plus prompt chunks up to that
    many tokens; without it a newcomer's whole prompt runs as its own pass.
    """
    if policy not in ("static", "continuous"):
        raise ValueError(f"policy must be 'static' or 'continuous', got {policy!r}")
    n = len(work.arrivals)
    first = np.full(n, np.nan)
    finish = np.full(n, np.nan)
    tokens: list[list[float]] = [[] for _ in range(n)]
    prefilled = np.zeros(n, dtype=int)
    running: list[int] = []
    next_arrival, t = 0, 0.0
    step_end: list[float] = []
    step_kind: list[str] = []
    padded = used = 0

    def emit(i: int, now: float) -> None:
        tokens[i].append(now)
        if len(tokens[i]) == 1:
            first[i] = now
        if len(tokens[i]) == work.answers[i]:
            finish[i] = now

    def done(i: int) -> bool:
        return len(tokens[i]) >= work.answers[i]

    while next_arrival < n or running:
        if not running and work.arrivals[next_arrival] > t:
            t = float(work.arrivals[next_arrival])
        may_join = policy == "continuous" or not running
        while may_join and next_arrival < n and work.arrivals[next_arrival] <= t and len(running) < max_batch:
            running.append(next_arrival)
            next_arrival += 1
        prefilling = [i for i in running if prefilled[i] < work.prompts[i]]
        decoding = [i for i in running if prefilled[i] >= work.prompts[i] and not done(i)]
        context = sum(int(work.prompts[i]) + len(tokens[i]) for i in decoding)
        if prefilling and chunk_budget is None:
            new_tokens = int(sum(work.prompts[i] - prefilled[i] for i in prefilling))
            t += float(step_time(model, chip.bandwidth, chip.flops, new_tokens, 0, overhead))
            for i in prefilling:
                prefilled[i] = work.prompts[i]
                emit(i, t)
            kind = "prefill"
        else:
            budget = (chunk_budget or 0) - len(decoding)
            chunked = []
            for i in prefilling:
                take = int(min(max(budget, 0), work.prompts[i] - prefilled[i]))
                if take:
                    chunked.append((i, take))
                    budget -= take
            chunk_tokens = sum(take for _, take in chunked)
            slots = len(running) if policy == "static" else len(decoding)
            t += float(step_time(model, chip.bandwidth, chip.flops, slots + chunk_tokens, context, overhead))
            for i in decoding:
                emit(i, t)
            for i, take in chunked:
                prefilled[i] += take
                if prefilled[i] == work.prompts[i]:
                    emit(i, t)
            used += len(decoding)
            if policy == "static":
                padded += len(running) - len(decoding)
            kind = "mixed" if chunked else "decode"
        step_end.append(t)
        step_kind.append(kind)
        if policy == "continuous" or all(done(i) for i in running):
            running = [i for i in running if not done(i)]
    return Outcome(first, finish, tokens, step_end, step_kind, padded, used)


@dataclass
class Latencies:
    """Per-request latency metrics, named as vLLM's benchmark names them (seconds)."""

    ttft: np.ndarray  # arrival to first token: queueing plus prefill
    tpot: np.ndarray  # mean gap between output tokens, first token excluded
    e2e: np.ndarray  # arrival to last token
    itl: np.ndarray  # every gap between consecutive tokens, all requests pooled
    output_tokens: int  # tokens generated in the run, first tokens included
    span: float  # first arrival to last token, the period every rate below is taken over

    @property
    def output_tps(self) -> float:
        """Output tokens per second over the run."""
        return self.output_tokens / self.span

    @property
    def request_rate(self) -> float:
        """Requests completed per second: throughput counted in requests."""
        return float(np.sum(np.isfinite(self.e2e))) / self.span

    def goodput(self, ttft_slo: float, tpot_slo: float) -> float:
        """Requests per second that met both promises, over the same period as request_rate."""
        met = (self.ttft <= ttft_slo) & (np.nan_to_num(self.tpot) <= tpot_slo)
        return float(np.sum(met)) / self.span


def latencies(work: Workload, run: Outcome) -> Latencies:
    """Turn a simulated run into TTFT, TPOT, end-to-end latency and inter-token gaps."""
    ttft = run.first_token - work.arrivals
    e2e = run.finish - work.arrivals
    tpot = np.where(work.answers > 1, (e2e - ttft) / np.maximum(work.answers - 1, 1), np.nan)
    gaps = [np.diff(times) for times in run.token_times if len(times) > 1]
    itl = np.concatenate(gaps) if gaps else np.array([])
    span = float(np.nanmax(run.finish) - work.arrivals.min())
    return Latencies(ttft, tpot, e2e, itl, int(work.answers.sum()), span)
