"""One model cut over N GPUs of a node (tensor parallelism): what each GPU holds and what they exchange.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; vLLM's ``--tensor-parallel-size``)
splits every weight matrix N ways. Each GPU holds 1/N of the weights and the keys and values
of 1/N of the KV heads, and does 1/N of the arithmetic. The price is talk: twice in every
layer (after attention and after the MLP) the GPUs add up their partial results with an
all-reduce of the activations, a message of tokens x hidden x 2 bytes (activations stay
16-bit even when the weights are quantized). A ring all-reduce makes each GPU send, and
receive, 2(N - 1)/N of the message, so a pass spends

    layers x 2 x 2(N - 1)/N x tokens x hidden x 2 bytes / interconnect bandwidth

on the link, after its arithmetic, not overlapped with it. Left out: the few microseconds
each all-reduce costs however small it is (it matters at small batches), kernels that
overlap talk with arithmetic, and pipeline parallelism. :func:`labkit.capacity.plan` uses
this split for ``tensor_parallel=N``; replicas are whole copies and need no talk at all.

Two kinds of model split differently. A mixture of experts is cut like any model, every
expert N ways (vLLM's default); :func:`expert_parallel_bytes_per_token_per_layer` counts what
expert parallelism sends instead. Multi-head latent attention caches one latent per token that
every head reads, so it cannot be shared out by heads: each GPU keeps the whole latent cache.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from labkit.sim.cost_model import ModelSpec
from labkit.sim.hardware import GB, Hardware

GPUS_PER_NODE = 8  # an HGX/DGX node: the GPUs that NVLink joins; past it the link is a slower network
ACTIVATION_BYTES = 2  # bf16 activations, whatever the weights are stored in
ALLREDUCES_PER_LAYER = 2  # one after attention's output projection, one after the MLP's down projection

LLAMA_3_1_70B = ModelSpec(
    "Llama 3.1 70B", 70_553_706_496, layers=80, kv_heads=8, head_dim=128, query_heads=64, context_length=131_072
)
"""The model of the sale that does not fit one card (141 GB of bf16 weights); shape from its config.json,
its 128K context (131,072 tokens) from Llama 3.1's model card."""

# The hidden size (the width of the activations an all-reduce adds up) of each preset, found by
# its shape, so that renamed or quantized copies of a preset (with_precision) still find theirs.
HIDDEN_SIZES: dict[tuple[int, int, int], int] = {
    (32, 8, 128): 4096,  # Llama 3.1 8B
    (36, 8, 128): 4096,  # Qwen3 8B
    (30, 3, 64): 576,  # SmolLM2 135M
    (80, 8, 128): 8192,  # Llama 3.1 70B
}


@dataclass(frozen=True)
class TensorSplit:
    """A model split ``ways`` ways: the shard one GPU holds, and the seconds of all-reduce per token."""

    ways: int
    shard: ModelSpec  # what one GPU holds and computes: 1/N of the parameters, its share of the KV heads
    hidden_size: int | None  # needed only when there is something to all-reduce (ways > 1)
    allreduce_bytes_per_token: float  # one all-reduce, sent by each GPU: 2(N-1)/N x hidden x 2 bytes
    allreduce_s_per_token: float  # all the all-reduces of a pass, per token it computes

    def allreduce_bytes_per_layer(self, tokens: float) -> float:
        """Bytes each GPU sends in one layer of a pass of ``tokens`` tokens (both of its all-reduces)."""
        return ALLREDUCES_PER_LAYER * self.allreduce_bytes_per_token * tokens


def hidden_size_of(model: ModelSpec) -> int:
    """The model's own ``hidden_size``, else the hidden size of a preset's shape; other models must say theirs."""
    if model.hidden_size is not None:
        return model.hidden_size
    try:
        return HIDDEN_SIZES[(model.layers, model.kv_heads, model.head_dim)]
    except KeyError:
        raise ValueError(
            f"the hidden size of {model.name} is not known; pass hidden_size= (--hidden-size), "
            "the hidden_size of its config.json"
        ) from None


def tensor_split(hardware: Hardware, model: ModelSpec, ways: int, hidden_size: int | None = None) -> TensorSplit:
    """``model`` split ``ways`` ways over GPUs like ``hardware``; ``ways=1`` is the whole model on one GPU."""
    if not (isinstance(ways, int) and 1 <= ways <= GPUS_PER_NODE):
        raise ValueError(
            f"tensor_parallel must be a whole number from 1 to {GPUS_PER_NODE} (the GPUs one NVLink node "
            f"joins), got {ways!r}; for more GPUs add replicas"
        )
    if ways == 1:
        return TensorSplit(1, model, hidden_size, 0.0, 0.0)
    if model.kv_heads % ways and ways % model.kv_heads:
        raise ValueError(
            f"tensor_parallel={ways} cannot share {model.name}'s {model.kv_heads} KV heads evenly; "
            f"use a number that divides {model.kv_heads} or a multiple of it"
        )
    if not hardware.interconnect_bandwidth > 0:
        raise ValueError(
            f"{hardware.name} has no interconnect bandwidth, so the all-reduces of tensor_parallel={ways} "
            "cannot be timed; give Hardware(..., interconnect_bandwidth=bytes/s each way) "
            "(--interconnect-gbs), or plan replicas of one GPU"
        )
    hidden = hidden_size_of(model) if hidden_size is None else hidden_size
    if not (isinstance(hidden, int) and hidden >= 1):
        raise ValueError(f"hidden_size must be a whole number, 1 or more; got {hidden!r}")
    # Past one KV head per GPU, vLLM copies heads: each GPU keeps one, so the cache splits kv_heads ways.
    shard = replace(
        model,
        name=f"{model.name}, 1/{ways} per GPU",
        parameters=model.parameters / ways,
        active_parameters=None if model.active_parameters is None else model.active_parameters / ways,
        kv_heads=max(1, model.kv_heads // ways),
        query_heads=None if model.query_heads is None else max(1, model.query_heads // ways),
    )
    message_bytes = 2 * (ways - 1) / ways * hidden * ACTIVATION_BYTES
    seconds = model.layers * ALLREDUCES_PER_LAYER * message_bytes / hardware.interconnect_bandwidth
    return TensorSplit(ways, shard, hidden, message_bytes, seconds)


def kv_share_per_gpu(model: ModelSpec, ways: int) -> float:
    """The share of each token's KV that one of ``ways`` GPUs holds: its KV heads, or all of an MLA latent."""
    if model.kv_lora_rank is not None:
        return 1.0
    return max(1, model.kv_heads // ways) / model.kv_heads


def tensor_parallel_bytes_per_token_per_layer(hidden_size: int, ways: int) -> float:
    """Bytes all ``ways`` GPUs send, together, for one token in one layer under tensor parallelism.

    Two ring all-reduces of the token's activations (hidden x 2 bytes), each GPU sending
    2(N - 1)/N of it in each: 2 x N x 2(N - 1)/N x hidden x 2 = 4(N - 1) x hidden x 2 bytes.
    Every layer pays it, whatever the model's experts.
    """
    _check_ways(ways)
    return ALLREDUCES_PER_LAYER * ways * 2 * (ways - 1) / ways * hidden_size * ACTIVATION_BYTES


def expert_parallel_bytes_per_token_per_layer(hidden_size: int, ways: int, experts_per_token: int) -> float:
    """Bytes all ``ways`` GPUs send, together, for one token in one MoE layer under expert parallelism.

    The experts are dealt out over N GPUs, each token's attention runs on the one GPU that holds
    its sequence (data-parallel attention), and two all-to-alls move it: dispatch sends the
    token's activations (hidden x 2 bytes) to each of its k experts, back comes each expert's
    output (combine). An expert sits on another GPU with probability (N - 1)/N, so

        2 x k x (N - 1)/N x hidden x 2 bytes.

    Against tensor parallelism's 4(N - 1) x hidden x 2 the ratio is k / (2N): DeepSeek-V3's
    top-8 over 8 GPUs sends half as much, Mixtral's top-2 an eighth. Left out: dispatchers
    that send a token once per GPU (or node) however many of its experts sit there, which send
    less, fp8 dispatch (DeepSeek-V3's), which halves the first half, and uneven routing, where the
    GPU with the popular experts sets the pace.
    """
    _check_ways(ways)
    if not (isinstance(experts_per_token, int) and experts_per_token >= 1):
        raise ValueError(f"experts_per_token must be a whole number, 1 or more; got {experts_per_token!r}")
    return 2 * experts_per_token * (ways - 1) / ways * hidden_size * ACTIVATION_BYTES


def _check_ways(ways: int) -> None:
    if not (isinstance(ways, int) and ways >= 1):
        raise ValueError(f"ways must be a whole number of GPUs, 1 or more; got {ways!r}")


def fewest_ways_that_fit(gpu_memory_bytes: float, memory_fraction: float, model: ModelSpec, tokens: int) -> int | None:
    """The smallest tensor-parallel size at which one conversation of ``tokens`` fits beside the weights."""
    usable = gpu_memory_bytes * memory_fraction
    for ways in range(1, GPUS_PER_NODE + 1):
        if model.kv_heads % ways and ways % model.kv_heads:
            continue
        if usable - model.weight_bytes / ways >= model.kv_bytes(tokens) * kv_share_per_gpu(model, ways):
            return ways
    return None


def does_not_fit(
    gpu_memory_bytes: float, memory_fraction: float, model: ModelSpec, split: TensorSplit, tokens: int
) -> str:
    """Why not one conversation fits on each GPU of ``split``, and the fix: more ways, or fewer bytes."""
    usable = gpu_memory_bytes * memory_fraction
    where = f"{memory_fraction:.0%} of {gpu_memory_bytes / GB:.1f} GB"
    if split.shard.weight_bytes >= usable:
        per_gpu = "" if split.ways == 1 else f" per GPU, split {split.ways} ways"
        problem = f"the weights of {model.name} ({split.shard.weight_bytes / GB:.1f} GB{per_gpu}) do not fit in {where}"
    else:
        per_gpu = "" if split.ways == 1 else f" on each of {split.ways} GPUs"
        problem = f"not one conversation of {tokens:,} tokens fits beside the weights{per_gpu} ({where})"
    ways = fewest_ways_that_fit(gpu_memory_bytes, memory_fraction, model, tokens)
    more = (
        f"split the model over {ways} GPUs (tensor_parallel={ways}, --tensor-parallel {ways}), "
        if ways is not None and ways > split.ways
        else ""
    )
    return (
        f"{problem}; {more}quantize (--weights int8 or int4, --kv fp8), shorten the prompt or answer, "
        "raise memory_fraction, or use a GPU with more memory"
    )
