"""A request's KV cache handed from one engine to another: prefill on one, decode on the other.

Why: a prompt's prefill is a long arithmetic-bound pass, and every decode sharing its step waits for it.
Disaggregated serving (DistServe, Splitwise, vLLM's KV connectors) prefills on one pool of GPUs and
decodes on another, each request's K/V travelling between them as a :class:`KVHandoff`. The K/V are read
token by token through the source's block table (:func:`read_tokens`) and written through the target's
(:func:`write_tokens`), so the two pools need not share block numbers, nor even a block size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from labkit.kv.fp8 import as_bytes
from labkit.sampling_params import SamplingParams


@dataclass(frozen=True)
class KVLayout:
    """What both engines must agree on for the K/V to mean the same thing (the block size need not match)."""

    model: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str  # the model's compute dtype, as str(torch.dtype)
    kv_cache_dtype: str  # "auto" or "fp8": what the pools store

    def mismatch(self, other: KVLayout) -> str | None:
        """The first field in which ``other`` (the target's) differs from this one (the hand-off's), in words."""
        for name in ("model", "num_layers", "num_kv_heads", "head_dim", "dtype", "kv_cache_dtype"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"{name} is {mine!r} in the hand-off but {theirs!r} in the target engine"
        return None


@dataclass(frozen=True)
class KVHandoff:
    """One request after its prefill, with everything another engine needs to continue it.

    ``keys[layer]`` and ``values[layer]`` are [num_computed_tokens, kv_heads, head_dim] in the pools' storage dtype
    (token t in row t); the last output token has no K/V yet (the target's first decode step computes it).
    ``generator_state`` (None when greedy) lets a seeded sampled answer continue as it would on one engine.
    """

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    num_computed_tokens: int
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    layout: KVLayout
    prompt: object = None  # the text or chat it came from, for the output
    generator_state: torch.Tensor | None = None

    def __post_init__(self):
        if len(self.keys) != self.layout.num_layers or len(self.values) != self.layout.num_layers:
            raise ValueError(
                f"a hand-off of {self.layout.num_layers} layers needs one K and one V tensor per layer, "
                f"got {len(self.keys)} and {len(self.values)}"
            )
        expected = (self.num_computed_tokens, self.layout.num_kv_heads, self.layout.head_dim)
        for name, tensors in (("keys", self.keys), ("values", self.values)):
            for layer, tensor in enumerate(tensors):
                if tuple(tensor.shape) != expected:
                    raise ValueError(
                        f"{name}[{layer}] is shaped {tuple(tensor.shape)}, not {expected} "
                        "(computed tokens, kv heads, head_dim)"
                    )

    @property
    def nbytes(self) -> int:
        """Bytes of K/V that travel: what a link between a prefill and a decode GPU would carry."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


def slots(table: Sequence[int], num_tokens: int, block_size: int) -> torch.Tensor:
    """The pool slot of each of a sequence's first ``num_tokens`` tokens: token t sits in
    ``table[t // block_size]`` at offset ``t % block_size``, slot ``block * block_size + offset``."""
    needed = -(-num_tokens // block_size)
    if len(table) < needed:
        raise ValueError(
            f"{num_tokens} tokens need {needed} blocks of {block_size}, but the block table has {len(table)}; "
            "allocate them first"
        )
    positions = torch.arange(num_tokens)
    blocks = torch.as_tensor(list(table[:needed]), dtype=torch.long)
    return blocks[positions // block_size] * block_size + positions % block_size


def read_tokens(pool: torch.Tensor, table: Sequence[int], num_tokens: int) -> torch.Tensor:
    """A sequence's first ``num_tokens`` rows of one layer's pool [num_blocks, block_size, heads, dim], in token
    order (through its block table, the last partial block included): [num_tokens, heads, dim], a copy."""
    flat = as_bytes(pool).reshape(-1, *pool.shape[2:])
    index = slots(table, num_tokens, pool.shape[1]).to(pool.device)
    return flat.index_select(0, index).view(pool.dtype)


def write_tokens(pool: torch.Tensor, table: Sequence[int], rows: torch.Tensor) -> None:
    """Write ``rows`` [num_tokens, heads, dim] (token t in row t) into one layer's pool through ``table``."""
    if rows.dtype != pool.dtype or tuple(rows.shape[1:]) != tuple(pool.shape[2:]):
        raise ValueError(
            f"rows of {rows.dtype} shaped {tuple(rows.shape[1:])} per token do not fit a pool of {pool.dtype} "
            f"shaped {tuple(pool.shape[2:])} per token"
        )
    flat = as_bytes(pool).view(-1, *pool.shape[2:])
    index = slots(table, rows.shape[0], pool.shape[1]).to(pool.device)
    flat.index_copy_(0, index, as_bytes(rows).to(pool.device))
