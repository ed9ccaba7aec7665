"""Batch-invariant pieces: a request's numbers do not depend on what shares its step (``LLM(deterministic=True)``).

Floating-point addition is not associative, so a sum's last bits depend on the order it is taken in.
A kernel whose order depends on the batch (matmul tiles chosen by the number of rows, a vector
reduction whose tail moves with the tensor's length, attention that reads a decode's keys in other
groups than a prefill's) gives a request other bits alone than in a crowd, and a greedy choice
between two close logits flips. Thinking Machines, "Defeating Nondeterminism in LLM Inference" (2025),
traced LLM servers' nondeterminism to exactly this, and fixed it by making every kernel batch-invariant:
its reduction order for one row is the same whatever the other rows. vLLM turns such kernels on with
``VLLM_BATCH_INVARIANT=1`` (GPUs only), SGLang with ``--enable-deterministic-inference``; this module
does it for labkit's CPU path, with plain PyTorch:

- :func:`fixed_order_sum` adds by halving (x[:n/2] + x[n/2:], again and again), elementwise adds in one tree
  fixed by the positions alone. Zeros padded at the end change nothing: a sum over a query's visible
  keys comes out the same in a tensor of 40 keys or of 4,000 (the invisible ones are exact zeros).
- :func:`tiled_linear` runs every matmul on tiles of exactly :data:`TILE_ROWS` rows (the last tile padded), so
  the BLAS library sees one shape whatever the batch, and picks one kernel: a row's product is the same
  at batch 1 and at batch 64 (this CPU's MKL, for one, takes another path below 12 rows).
- :func:`rms_norm` reduces each vector with :func:`fixed_order_sum`.
- :func:`batch_invariant_attention` computes softmax(q·k)·v for every query row the same way, whether it is
  a decode, a prompt chunk, a speculative verification, and whether its keys were cached or just computed:
  the scores and the weighted sum of values are :func:`fixed_order_sum` over the head dimension and over
  the keys, the maximum is exact in any order.

int8 linears (:mod:`labkit.models.int8_linear`) need no tiles: their sums are int32, exact in any order,
and each row is quantized with its own scale. The price is speed (see the README's serving section).
"""

from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from labkit.kv.paged_batch import PagedBatch

TILE_ROWS = 16  # rows of every matmul tile: one decode row costs a 16-row product
QUERY_TILE = 16  # query rows attended at once (bounds the [queries, keys, heads, D] products in memory)


def fixed_order_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x.sum(dim)``, added in one tree fixed by the positions along ``dim``, whatever ``x``'s other dims.

    ``dim`` is padded with zeros to a power of two, then halved: element i is added to element i + n/2.
    Trailing zeros only add exact zeros, so the result for the first m entries is the same at any length.
    """
    x = x.movedim(dim, -1)
    width = 1 << max(x.shape[-1] - 1, 0).bit_length()
    if width != x.shape[-1]:
        x = F.pad(x, (0, width - x.shape[-1]))
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


def tiled_linear(linear, tile_rows: int = TILE_ROWS):
    """``linear`` computed tile by tile, each tile exactly ``tile_rows`` rows (the last one padded with zeros)."""

    def tiled(x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        count = rows.shape[0]
        padded = F.pad(rows, (0, 0, 0, -count % tile_rows))
        out = torch.cat([linear(tile) for tile in padded.split(tile_rows)])[:count]
        return out.reshape(*x.shape[:-1], out.shape[-1])

    return tiled


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """:func:`labkit.models.layers.rms_norm`, each vector's mean square added in a fixed order."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(fixed_order_sum(x32 * x32)[..., None] / x.shape[-1] + eps)
    return weight * x32.to(x.dtype)


def batch_invariant_model(model):
    """A copy of ``model`` whose matmuls run on fixed row tiles and whose norms add in a fixed order.

    An int8 model's linears are already exact per row (int32 sums): only its norms change.
    """
    from labkit.models.int8_model import Int8Model

    copy = object.__new__(type(model))
    vars(copy).update(vars(model))
    copy.rms_norm = rms_norm
    if not isinstance(model, Int8Model):
        names = ("qkv", "o_proj", "gate_up", "down")
        copy.layers = [replace(layer, **{n: tiled_linear(getattr(layer, n)) for n in names}) for layer in model.layers]
        copy.lm_head = tiled_linear(model.lm_head)
    copy.batch_invariant = True
    return copy


def batch_invariant_attention(
    layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch
) -> torch.Tensor:
    """Paged attention (the engine's :class:`~labkit.engine.interfaces.Attention`) whose sums over D and
    over keys are :func:`fixed_order_sum`: each query row gets the same bits in any step, computed in fp32."""
    out = torch.empty_like(q)
    for group in batch.decode_groups:  # one query row per sequence, its keys padded to the group's width
        rows = slice(group.start, group.stop)
        keys = k_pool.index_select(0, group.blocks).view(group.stop - group.start, -1, *k_pool.shape[2:])
        values = v_pool.index_select(0, group.blocks).view_as(keys)
        visible = group.mask[:, 0, 0, :] == 0
        out[rows] = _attend(q[rows], keys, values, visible)
    prefills = zip(batch.sequences[batch.num_decodes :], batch.prefill_blocks, batch.prefill_masks)
    for seq, blocks, mask in prefills:  # several query rows of one sequence: its keys, shared
        keys = k_pool.index_select(0, blocks).flatten(0, 1)[None, : seq.context_len]
        values = v_pool.index_select(0, blocks).flatten(0, 1)[None, : seq.context_len]
        for start in range(0, seq.num_query, QUERY_TILE):
            stop = min(start + QUERY_TILE, seq.num_query)
            rows = slice(seq.start + start, seq.start + stop)
            out[rows] = _attend(q[rows], keys, values, mask[start:stop])
    return out


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√D)·v for q [Q, Hq, D], keys and values [Q or 1, Tk, Hkv, D], ``visible`` [Q, Tk]."""
    group_size = q.shape[1] // keys.shape[2]
    keys = keys.float().repeat_interleave(group_size, dim=2)  # [Q or 1, Tk, Hq, D]
    values = values.float().repeat_interleave(group_size, dim=2)
    scaled = q.float() * (1 / math.sqrt(q.shape[-1]))
    scores = fixed_order_sum(scaled[:, None] * keys)  # [Q, Tk, Hq]
    scores = scores.masked_fill(~visible[:, :, None], float("-inf"))
    weights = torch.exp(scores - scores.amax(dim=1, keepdim=True))  # the maximum is exact in any order
    total = fixed_order_sum(weights, dim=1)  # [Q, Hq]
    weighted = fixed_order_sum(weights[..., None] * values, dim=1)  # [Q, Hq, D]
    return (weighted / total[..., None]).to(q.dtype)
