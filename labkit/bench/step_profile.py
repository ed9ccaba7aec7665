"""Where one decode step's time goes, at batch 1, 8, 32 and 64, and how far it is from its memory floor.

Measured on the real engine, by difference, with nothing instrumented in the model's code:

- **step**: ``llm.step()`` as the engine's trace records it, decode steps only;
- **model forward**: the same steps' calls of ``model.forward`` (timed by wrapping it);
- **linear layers**: the model's own q/k/v, o, gate/up and down projections of every layer and
  its LM head, timed alone on inputs of the batch's shape;
- **attention**: the forward with the engine's paged attention, minus the same forward with an
  attention that does nothing (``attend`` returning ``q``);
- **norms, RoPE and the rest**: the forward without attention, minus the linear layers
  (embedding, RMSNorm, rotary embedding, SwiGLU's activation, residual adds);
- **sampling, scheduler and Python**: the step minus its forward (choosing tokens, the
  scheduler, block tables, outputs);
- **in the server, text and events** (beside the step, not part of it): what ``labkit serve`` adds
  to each such step, timed on its own code: every request's answer so far decoded to text
  (:class:`~labkit.serve.text.TextStream`, which decodes the whole answer at each step) and sent as
  one server-sent event of a chat stream, for answers ``SERVER_ANSWER_TOKENS`` tokens long.

The floor is what the step must at least take on this machine's memory: every weight and the
batch's KV cache read once, divided by the measured copy bandwidth.

Each batch size can be profiled with more than one attention (``ATTENTIONS``: the gather into a padded
buffer, or the walk over the block tables that skips that copy) and KV cache storage (``kv_cache_dtype``),
taken in turns, one batch size at a time, so that a change in the machine's load falls on all of them alike.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from labkit.device import synchronize
from labkit.engine.config import KV_CACHE_DTYPES
from labkit.kv.blockwise_attention import blockwise_attention
from labkit.kv.fp8 import kv_storage_dtype
from labkit.kv.paged_attention import paged_attention
from labkit.sampling_params import SamplingParams

BATCHES = (1, 8, 32, 64)
PARTS = ("linear layers", "attention", "norms, RoPE and the rest", "sampling, scheduler and Python")
SERVER_ANSWER_TOKENS = 128  # about W2's mean answer; the server's text cost grows with the answer so far
# labkit's decode attentions by name: a padded copy read by SDPA, or the block tables walked part by part (CPU)
ATTENTIONS = {"gather": paged_attention, "blockwise": blockwise_attention}


@dataclass(frozen=True)
class StepProfile:
    """One batch size: the decode step's time, its parts (ms) and its memory floor (ms)."""

    batch_size: int
    context: int
    attention: str  # a name in ATTENTIONS
    kv_cache_dtype: str
    step_ms: float
    parts_ms: dict[str, float]
    floor_ms: float
    server_ms: float | None = None  # labkit serve's text and events for this step's requests; None: no tokenizer

    @property
    def floor_fraction(self) -> float:
        """The memory floor as a share of the step: 1.0 would be a step that only moves bytes."""
        return self.floor_ms / self.step_ms


def _median_ms(fn, repeats: int) -> float:
    times = []
    with torch.inference_mode():
        fn()  # warm up
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times)


def _linear_ms(model, batch_size: int, repeats: int) -> float:
    """The projections of every layer and the LM head on a decode batch, timed alone."""
    cfg = model.config
    generator = torch.Generator().manual_seed(0)

    def rows(width: int) -> torch.Tensor:
        return torch.randn(batch_size, width, generator=generator).to(model.device, model.dtype)

    hidden, heads = rows(cfg.hidden_size), rows(cfg.num_heads * cfg.head_dim)
    inner = rows(cfg.intermediate_size)

    def run() -> None:
        for layer in model.layers:
            layer.qkv(hidden), layer.o_proj(heads), layer.gate_up(hidden), layer.down(inner)
        model.lm_head(hidden)
        synchronize(model.device)

    return _median_ms(run, repeats)


def _server_ms(tokenizer, answers: list[list[int]], repeats: int) -> float:
    """What labkit serve does for a step of these requests besides the step: each answer so far to text, one event each."""
    from labkit.serve.protocol import CHAT, Reply, sse_event
    from labkit.serve.text import TextStream

    reply = Reply.new("chatcmpl-profile", CHAT, "profile")

    def run() -> None:
        for answer in answers:
            piece = TextStream(tokenizer).update(answer, finished=False)
            sse_event(reply.chunk(piece))

    return _median_ms(run, repeats)


def _decode_steps(
    llm, model, ids: torch.Tensor, params: SamplingParams, repeats: int
) -> list[tuple[float, float, tuple]]:
    """Serve ``ids``'s rows until ``repeats`` steps decoded them all: each such step's seconds, its forward pass's
    seconds and the forward's arguments."""
    batch_size = ids.shape[0]
    forwards: list[tuple[float, tuple]] = []
    plain_forward = model.forward

    def timed_forward(*args):
        started = time.perf_counter()
        out = plain_forward(*args)
        synchronize(model.device)
        forwards.append((time.perf_counter() - started, args))
        return out

    request_ids = [llm.add_request(row, params, arrival_time=0.0) for row in ids.tolist()]
    decode: list[tuple[float, float, tuple]] = []
    model.forward = timed_forward
    try:
        while llm.has_unfinished() and len(decode) < repeats:
            llm.step()
            step = llm.trace.steps[-1]
            if step.num_prefill_tokens == 0 and step.num_decode_tokens == batch_size:
                decode.append((step.end - step.start, *forwards[-1]))
    finally:
        del model.forward  # back to the class's method
        for request_id in request_ids:
            llm.abort_request(request_id)
    if len(decode) < repeats:
        raise RuntimeError(f"only {len(decode)} steps decoded all {batch_size} sequences; raise the pool")
    return decode


def profile_batch(
    model,
    batch_size: int,
    context: int,
    bandwidth: float,
    repeats: int = 8,
    attention: str = "gather",
    kv_cache_dtype: str = "auto",
) -> StepProfile:
    """Decode ``batch_size`` sequences of ``context`` prompt tokens and take their steps apart."""
    from labkit.engine.llm import LLM

    # Prompts are prefilled a few per step, so the first ones decode while the last wait: room for
    # that many tokens more, and only steps that decode the whole batch are measured.
    length = context + batch_size + repeats + 8
    llm = LLM(
        model,
        max_num_seqs=batch_size,
        max_model_len=length,
        num_blocks=batch_size * (length // 16 + 2),
        attention=ATTENTIONS[attention],
        kv_cache_dtype=kv_cache_dtype,
    )
    ids = torch.randint(0, model.config.vocab_size, (batch_size, context), generator=torch.Generator().manual_seed(0))
    plain_forward = model.forward
    decode = _decode_steps(llm, model, ids, SamplingParams(max_tokens=length - context - 1, ignore_eos=True), repeats)
    step_ms = 1e3 * statistics.median(step for step, _, _ in decode)
    forward_ms = 1e3 * statistics.median(forward for _, forward, _ in decode)
    input_ids, positions, _, logits_indices = decode[-1][2]
    bare_ms = _median_ms(lambda: plain_forward(input_ids, positions, lambda i, q, k, v: q, logits_indices), repeats)
    linear_ms = _linear_ms(model, batch_size, repeats)
    parts = {
        "linear layers": linear_ms,
        "attention": forward_ms - bare_ms,
        "norms, RoPE and the rest": bare_ms - linear_ms,
        "sampling, scheduler and Python": step_ms - forward_ms,
    }
    kv_bytes = batch_size * context * model.config.kv_bytes_per_token(kv_storage_dtype(kv_cache_dtype, model.dtype))
    floor_ms = 1e3 * (model.weight_bytes() + kv_bytes) / bandwidth
    server_ms = None
    if model.tokenizer is not None:
        answers = [(row * -(-SERVER_ANSWER_TOKENS // context))[:SERVER_ANSWER_TOKENS] for row in ids.tolist()]
        server_ms = _server_ms(model.tokenizer, answers, repeats)
    return StepProfile(batch_size, context, attention, kv_cache_dtype, step_ms, parts, floor_ms, server_ms)


def step_profile(
    model,
    bandwidth: float,
    batches=BATCHES,
    context: int = 256,
    repeats: int = 8,
    attentions: Sequence[str] = ("gather",),
    kv_cache_dtypes: Sequence[str] = ("auto",),
    progress: Callable[[str], None] | None = None,
) -> list[StepProfile]:
    """Every batch size with every attention and KV cache storage, these taken in turns at each batch size;
    ``progress`` gets the table's header, then each row as soon as it is measured."""
    for kind, asked, known in (
        ("attention", attentions, ATTENTIONS),
        ("kv_cache_dtype", kv_cache_dtypes, KV_CACHE_DTYPES),
    ):
        unknown = sorted(set(asked) - set(known))
        if unknown or not asked:
            raise ValueError(f"unknown {kind} {', '.join(unknown) or '(none given)'}: choose from {', '.join(known)}")
    say = progress or (lambda line: None)
    say(_HEADER)
    profiles = []
    for batch in batches:
        for attention in attentions:
            for kv in kv_cache_dtypes:
                profiles.append(profile_batch(model, batch, context, bandwidth, repeats, attention, kv))
                say(_row(profiles[-1]))
    return profiles


_HEADER = (
    f"{'batch':>5} {'attention':>9} {'kv cache':>8} {'step ms':>8} "
    + " ".join(f"{part[:22]:>24}" for part in PARTS)
    + f" {'floor':>12} {'+ server text, events':>22}"
)


def _row(p: StepProfile) -> str:
    cells = " ".join(f"{p.parts_ms[part]:>9.2f} ms ({p.parts_ms[part] / p.step_ms:>5.0%})   " for part in PARTS)
    server = "no tokenizer" if p.server_ms is None else f"{p.server_ms:.2f} ms ({p.server_ms / p.step_ms:.0%})"
    return (
        f"{p.batch_size:>5} {p.attention:>9} {p.kv_cache_dtype:>8} {p.step_ms:>8.2f} {cells} "
        f"{p.floor_ms:>6.2f} ({p.floor_fraction:.0%}) {server:>22}"
    )


def format_profile(profiles: list[StepProfile]) -> str:
    """A table: the step, each part in ms and its share, and the memory floor's share of the step."""
    return "\n".join([_HEADER, *map(_row, profiles), profile_note(profiles[0].context)])


def profile_note(context: int) -> str:
    """What the table's numbers are, printed under it."""
    return (
        f"(decode steps after a {context}-token prompt each; a negative part is within the noise "
        "of the differences it is taken from; floor: weights + KV read once at the measured bandwidth; "
        f"server: what labkit serve adds to such a step, every answer {SERVER_ANSWER_TOKENS} tokens so far "
        "decoded to text and sent as one event)"
    )
