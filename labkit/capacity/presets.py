"""The course's worked examples, rebuilt from the numbers their texts quote: the sale and the friends' card.

The sources did not publish their tables, so each preset says which quote pins each input;
``plan(**SALE_EXAMPLE)`` then reproduces every figure they quote.
"""

from __future__ import annotations

from dataclasses import replace

from labkit.capacity.parallel import LLAMA_3_1_70B
from labkit.capacity.planner import plan
from labkit.sim.cost_model import MODELS
from labkit.sim.hardware import GB, TB, TFLOPS, Hardware

# The lessons say "8B" and compute with 8.0e9 parameters (16 GB of BF16 weights); the real
# checkpoint holds 8.03e9. Their figures are reproduced only with the round number.
LESSON_LLAMA_8B = replace(MODELS["llama-3.1-8b"], name="Llama 3.1 8B (round 8e9 parameters)", parameters=8e9)

SALE_GPU = Hardware(
    "the sale's GPU (A100-class, round figures)",
    80 * GB,
    2 * TB,
    150 * TFLOPS,
    "from the lesson Serving many users at once: 2 TB/s is quoted; 150 TFLOP/s gives both its critical batch of 75 "
    "and its 35.0 ms arithmetic term; about half the A100's 312 TFLOP/s peak, a rate kernels reach; "
    "NVLink as the A100's, 300 GB/s each way. Already the achievable rate the planner rates every GPU at "
    "(the named A100 gets half of 312, 156 TFLOP/s, and 2.039 TB/s: the same card unrounded)",
    interconnect_bandwidth=300 * GB,
    flops_achievable=True,
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
"""The festival-sale plan of the lesson Serving many users at once ("Capacity planning, by hand"), rebuilt from its quotes.

Inputs and the quotes that pin them: 80 GB card at 90% (72 GB, less 16 GB of weights,
leaves 56 GB); 1,000-token prompt and 300-token answer (1,300 tokens x 128 KiB per
conversation: 328 fit; mean context 1,000 + 300/2 = 1,150 tokens); 2 TB/s and 150 TFLOP/s
(memory term 32.7 ms, arithmetic 35.0 ms, critical batch 75); 3 ms overhead per pass
(step 38.0 ms; prefill 109.7 ms, so 144.4 ms of GPU time per request of which 34.7 ms is
decode). Outputs then match every quote: 125 tokens/s for one stream, about 17x that in
total, 24% decode share, 158 ms between a user's tokens, a 6.9 requests/s ceiling, and
under a 50 ms promise 5.9 requests/s with 88 conversations in flight, about 15% lost.
The planner also counts attention's arithmetic in the prefill, which the lesson leaves out
(1.7 ms more), so ``plan(**SALE_EXAMPLE)`` gives 146.2 ms, 16x, 160 ms, 6.8 requests/s, and
5.8 requests/s with 87 in flight: the quotes to within about 1%.
The price, $2.00 per GPU-hour, is our assumption: the source quotes no price.
"""

SALE_70B_EXAMPLE: dict = dict(SALE_EXAMPLE, model=LLAMA_3_1_70B)
"""The sale with a bot ten times the size: Llama 3.1 70B on the same cards. Its 141 GB of bf16
weights fit no single card, so it must be split (``tensor_parallel``) or quantized."""


def sale_load(multiple: float = 10.0) -> float:
    """Requests/s of a sale bringing ``multiple`` times the usual traffic.

    The sources quote "ten times the usual number of chats" but not the usual number; we take
    it to be what one card of :data:`SALE_EXAMPLE` carries within its promise (5.8 requests/s),
    the traffic the bot serves on an ordinary day.
    """
    if not multiple > 0:
        raise ValueError(f"multiple must be positive, got {multiple!r}; 10 for a sale of ten times the usual")
    return multiple * plan(**SALE_EXAMPLE).promise_load_per_s


FRIENDS_GPU = Hardware(
    "a 24 GB card close to an RTX 4090",
    24 * GB,
    1 * TB,
    165 * TFLOPS,
    "the article What Happens Inside an LLM Server When 10 People Send a Prompt: 1 TB/s, 165 TFLOP/s, "
    "the RTX 4090's datasheet peak (the planner rates it at half, as every GPU)",
)

FRIENDS_EXAMPLE: dict = dict(
    hardware=FRIENDS_GPU, model=LESSON_LLAMA_8B, prompt_len=6144, answer_len=2048, memory_fraction=0.85
)
"""The ten friends' Llama 3.1 8B (What Happens Inside an LLM Server When 10 People Send a Prompt) on a 24 GB card, friends chatting at 8K tokens each.

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


def sale_fleet_gpu() -> dict:
    """One GPU of the sale as the simulator's fleets take it: ``cost`` (its cost model, 3 ms a pass) and
    ``num_blocks`` (the KV blocks that fit beside the weights), e.g. ``disaggregation_table(..., **sale_fleet_gpu())``."""
    from labkit.sim.cost_model import CostModel
    from labkit.sim.simulator import blocks_that_fit  # the simulator only once a fleet is simulated

    hardware, model = SALE_EXAMPLE["hardware"], SALE_EXAMPLE["model"]
    return dict(
        cost=CostModel.from_parts(hardware, model, SALE_EXAMPLE["overhead_s"]),
        num_blocks=blocks_that_fit(hardware, model),
    )
