"""PagedAttention for decode steps as a GPU runs it: Triton kernels that read each KV block where it lies.

labkit's own attention (:mod:`labkit.kv.paged_attention`) first *copies* every sequence's blocks into a
padded buffer (``index_select``) and then runs SDPA over the copy: on a GPU the copy moves as many bytes
as the attention reads. These kernels skip it. One program serves one (sequence, KV head): it loads the
queries of that KV head's group once (grouped-query attention: the group shares every key it reads),
walks the sequence's block table, loads each block's keys and values from the pool in place, masks the
slots past the context in the last block, and keeps a running softmax (the running max, the sum of
exponentials and the weighted values, rescaled whenever the max grows), so the scores of all the
blocks never need to be held at once.

A few long sequences leave most of a GPU idle (one program per sequence and KV head). Split-KV
("flash-decoding") cuts each sequence's blocks into ``num_splits`` runs, one program each, that keep
their partial max, sum and weighted values; a second kernel merges them, rescaling each split's part
to the common max.

These are the reference solutions lab 11 checks against; :func:`decode_attention` plugs them into the
engine's attention seam (decode rows; prefill rows stay on :func:`~labkit.kv.paged_attention.paged_attention`).
Layouts: queries and outputs ``[seqs, query heads, head_dim]``, pools ``[blocks, block_size, kv heads,
head_dim]``, block tables ``[seqs, max blocks]`` and context lengths ``[seqs]`` as int32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from labkit.kernels.contract import UNWRITTEN
from labkit.kernels.runtime import launch, tl, triton
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch


@triton.jit
def _walk_blocks(
    q,
    k_pool_ptr,
    v_pool_ptr,
    block_tables_ptr,
    seq,
    kv_head,
    context_len,
    first,
    last,
    scale,
    max_blocks_per_seq,
    GROUP_PAD: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """The running softmax of the group's queries ``q`` over blocks ``first`` to ``last`` of the sequence's table:
    (running max, sum of exponentials, exp-weighted values), each per query head; max -inf and 0s if none."""
    dims = tl.arange(0, HEAD_DIM)
    slots = tl.arange(0, BLOCK_SIZE)
    running_max = tl.zeros([GROUP_PAD], dtype=tl.float32) - float("inf")
    running_sum = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    for index in range(first, last):
        block = tl.load(block_tables_ptr + seq * max_blocks_per_seq + index).to(tl.int64)
        visible = index * BLOCK_SIZE + slots < context_len  # the last block may be partly filled
        offsets = ((block * BLOCK_SIZE + slots)[:, None] * NUM_KV_HEADS + kv_head) * HEAD_DIM + dims[None, :]
        k = tl.load(k_pool_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
        v = tl.load(v_pool_ptr + offsets, mask=visible[:, None], other=0.0).to(tl.float32)
        scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale  # [group, block_size]
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        rescale = tl.exp(running_max - new_max)  # what the old terms were worth against the new max
        weights = tl.exp(scores - new_max[:, None])
        running_sum = running_sum * rescale + tl.sum(weights, axis=1)
        acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)
        running_max = new_max
    return running_max, running_sum, acc


@triton.jit
def paged_decode_kernel(
    out_ptr,
    q_ptr,
    k_pool_ptr,
    v_pool_ptr,
    block_tables_ptr,
    context_lens_ptr,
    scale,
    max_blocks_per_seq,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    in_group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + in_group  # the query heads that read this KV head
    rows = (seq * NUM_KV_HEADS * GROUP + heads)[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    q = tl.load(q_ptr + rows, mask=(in_group < GROUP)[:, None], other=0.0).to(tl.float32)
    context_len = tl.load(context_lens_ptr + seq)
    _, running_sum, acc = _walk_blocks(
        q,
        k_pool_ptr,
        v_pool_ptr,
        block_tables_ptr,
        seq,
        kv_head,
        context_len,
        0,
        tl.cdiv(context_len, BLOCK_SIZE),
        scale,
        max_blocks_per_seq,
        GROUP_PAD,
        NUM_KV_HEADS,
        BLOCK_SIZE,
        HEAD_DIM,
    )
    out = acc / running_sum[:, None]
    tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=(in_group < GROUP)[:, None])


@triton.jit
def split_kv_kernel(
    max_out_ptr,
    sum_out_ptr,
    acc_out_ptr,
    q_ptr,
    k_pool_ptr,
    v_pool_ptr,
    block_tables_ptr,
    context_lens_ptr,
    scale,
    max_blocks_per_seq,
    blocks_per_split,
    NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    in_group = tl.arange(0, GROUP_PAD)
    heads = kv_head * GROUP + in_group
    dims = tl.arange(0, HEAD_DIM)
    rows = (seq * NUM_KV_HEADS * GROUP + heads)[:, None] * HEAD_DIM + dims[None, :]
    q = tl.load(q_ptr + rows, mask=(in_group < GROUP)[:, None], other=0.0).to(tl.float32)
    context_len = tl.load(context_lens_ptr + seq)
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, tl.cdiv(context_len, BLOCK_SIZE))
    # a split past the context walks no block at all and stays empty (max -inf, sum 0)
    running_max, running_sum, acc = _walk_blocks(
        q,
        k_pool_ptr,
        v_pool_ptr,
        block_tables_ptr,
        seq,
        kv_head,
        context_len,
        first,
        last,
        scale,
        max_blocks_per_seq,
        GROUP_PAD,
        NUM_KV_HEADS,
        BLOCK_SIZE,
        HEAD_DIM,
    )
    # partials [seqs, query heads, splits] and [seqs, query heads, splits, head_dim]
    partial = (seq * NUM_KV_HEADS * GROUP + heads) * NUM_SPLITS + split
    keep = in_group < GROUP
    tl.store(max_out_ptr + partial, running_max, mask=keep)
    tl.store(sum_out_ptr + partial, running_sum, mask=keep)
    tl.store(acc_out_ptr + partial[:, None] * HEAD_DIM + dims[None, :], acc, mask=keep[:, None])


@triton.jit
def merge_splits_kernel(
    out_ptr,
    max_ptr,
    sum_ptr,
    acc_ptr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    row = tl.program_id(0)  # one (sequence, query head)
    splits = tl.arange(0, SPLITS_PAD)
    present = splits < NUM_SPLITS
    dims = tl.arange(0, HEAD_DIM)
    maxes = tl.load(max_ptr + row * NUM_SPLITS + splits, mask=present, other=float("-inf"))
    sums = tl.load(sum_ptr + row * NUM_SPLITS + splits, mask=present, other=0.0)
    accs = tl.load(
        acc_ptr + (row * NUM_SPLITS + splits)[:, None] * HEAD_DIM + dims[None, :], mask=present[:, None], other=0.0
    )
    overall = tl.max(maxes, axis=0)
    worth = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - overall))  # an empty split is worth nothing
    total = tl.sum(sums * worth, axis=0)
    out = tl.sum(accs * worth[:, None], axis=0) / total
    tl.store(out_ptr + row * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


def reference_decode(q, k_pool, v_pool, block_tables, context_lens) -> torch.Tensor:
    """The same attention in plain PyTorch, one sequence at a time (gather, then softmax): what the kernels must equal."""
    num_heads, num_kv_heads = q.shape[1], k_pool.shape[2]
    out = torch.empty_like(q)
    for seq, length in enumerate(context_lens.tolist()):
        blocks = block_tables[seq, : -(-length // k_pool.shape[1])].long()
        keys = k_pool[blocks].flatten(0, 1)[:length].float().repeat_interleave(num_heads // num_kv_heads, dim=1)
        values = v_pool[blocks].flatten(0, 1)[:length].float().repeat_interleave(num_heads // num_kv_heads, dim=1)
        scores = torch.einsum("hd,thd->ht", q[seq].float(), keys) / math.sqrt(q.shape[2])
        out[seq] = torch.einsum("ht,thd->hd", scores.softmax(dim=-1), values).to(q.dtype)
    return out


def _check_layout(q, k_pool, v_pool, block_tables, context_lens) -> None:
    """Raise a ValueError naming the tensor and the fix where an input is not laid out as the kernels read it:
    they compute offsets from the shapes alone, so a strided view or a float table would be read wrong, silently."""
    if k_pool.shape != v_pool.shape or k_pool.dtype != v_pool.dtype:
        raise ValueError(
            f"the key and value pools differ ({tuple(k_pool.shape)} {k_pool.dtype} against {tuple(v_pool.shape)} "
            f"{v_pool.dtype}): the kernels read both with one set of offsets"
        )
    if block_tables.dim() != 2 or context_lens.shape != (block_tables.shape[0],) or q.shape[0] != len(context_lens):
        raise ValueError(
            f"block_tables {tuple(block_tables.shape)} and context_lens {tuple(context_lens.shape)} should be "
            f"[sequences, max_blocks_per_seq] and [sequences], with one sequence per query row ({q.shape[0]})"
        )
    for name, tensor in (
        ("k_pool", k_pool),
        ("v_pool", v_pool),
        ("block_tables", block_tables),
        ("context_lens", context_lens),
    ):
        if not tensor.is_contiguous():
            raise ValueError(
                f"{name} is a strided view: the kernels read it as one dense array; pass {name}.contiguous()"
            )
    for name, tensor in (("block_tables", block_tables), ("context_lens", context_lens)):
        if tensor.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"{name} holds {tensor.dtype}: the kernels read block numbers and lengths as integers")


def _shapes(q: torch.Tensor, k_pool: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(sequences, query heads, KV heads, block size, head_dim), checked to fit the kernels."""
    num_seqs, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, pool_dim = k_pool.shape
    if pool_dim != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"queries {tuple(q.shape)} and pool {tuple(k_pool.shape)} do not fit: the head_dims must agree and "
            "the query heads must be a multiple of the KV heads"
        )
    for name, value in (("block_size", block_size), ("head_dim", head_dim)):
        if value & (value - 1):
            raise ValueError(f"the kernels need a power of two for {name}, got {value}")
    return num_seqs, num_heads, num_kv_heads, block_size, head_dim


def launch_paged_decode(
    kernel,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
) -> torch.Tensor:
    """Run a paged decode kernel (labkit's or yours, with :func:`paged_decode_kernel`'s parameters) over the
    grid (sequences, KV heads); the attention output, shaped like ``q``."""
    _check_layout(q, k_pool, v_pool, block_tables, context_lens)
    num_seqs, num_heads, num_kv_heads, block_size, head_dim = _shapes(q, k_pool)
    group = num_heads // num_kv_heads
    out, guard = _guarded(q.shape, UNWRITTEN, q.dtype, q.device)  # rows the kernel never writes show as such
    launch(
        kernel,
        (num_seqs, num_kv_heads),
        out_ptr=out,
        q_ptr=q.contiguous(),
        k_pool_ptr=k_pool,
        v_pool_ptr=v_pool,
        block_tables_ptr=block_tables,
        context_lens_ptr=context_lens,
        scale=1.0 / math.sqrt(head_dim),
        max_blocks_per_seq=block_tables.shape[1],
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
    )
    _check_guard(guard, "the output")
    return out


def _guarded(shape: tuple[int, ...], fill: float, dtype: torch.dtype, device: torch.device):
    """(a tensor of ``shape`` filled with ``fill``, the guard): one more row of its first dimension right after it
    in memory, where a store past its end lands instead of corrupting other memory."""
    buffer = torch.full((shape[0] + 1, *shape[1:]), fill, dtype=dtype, device=device)
    return buffer[:-1], buffer[-1]


def _check_guard(guard: torch.Tensor, what: str) -> None:
    """Raise if a kernel stored into ``guard`` (it still holds its fill, NaN or :data:`UNWRITTEN`, when untouched)."""
    untouched = torch.isnan(guard) | (guard == UNWRITTEN)
    if not bool(untouched.all()):
        raise IndexError(
            f"the kernel stored past the end of {what}: a store must leave out the padding rows of the group "
            "(mask=in_group < GROUP), which lie past the last query head"
        )


def launch_split_kv(
    split_kernel,
    merge_kernel,
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    num_splits: int,
) -> torch.Tensor:
    """Run a split-KV pair (labkit's or yours): ``num_splits`` programs per (sequence, KV head) keep partial
    results, then one program per (sequence, query head) merges them; the attention output, shaped like ``q``."""
    if num_splits < 1:
        raise ValueError(f"num_splits must be 1 or more, got {num_splits}")
    _check_layout(q, k_pool, v_pool, block_tables, context_lens)
    num_seqs, num_heads, num_kv_heads, block_size, head_dim = _shapes(q, k_pool)
    group = num_heads // num_kv_heads
    blocks_per_split = -(-block_tables.shape[1] // num_splits)
    # NaN until written: a partial the split kernel never stores poisons its row instead of passing for empty
    (maxes, max_guard), (sums, sum_guard), (accs, acc_guard) = (
        _guarded(shape, math.nan, torch.float32, q.device)
        for shape in [(num_seqs, num_heads, num_splits)] * 2 + [(num_seqs, num_heads, num_splits, head_dim)]
    )
    launch(
        split_kernel,
        (num_seqs, num_kv_heads, num_splits),
        max_out_ptr=maxes,
        sum_out_ptr=sums,
        acc_out_ptr=accs,
        q_ptr=q.contiguous(),
        k_pool_ptr=k_pool,
        v_pool_ptr=v_pool,
        block_tables_ptr=block_tables,
        context_lens_ptr=context_lens,
        scale=1.0 / math.sqrt(head_dim),
        max_blocks_per_seq=block_tables.shape[1],
        blocks_per_split=blocks_per_split,
        NUM_SPLITS=num_splits,
        GROUP=group,
        GROUP_PAD=triton.next_power_of_2(group),
        NUM_KV_HEADS=num_kv_heads,
        BLOCK_SIZE=block_size,
        HEAD_DIM=head_dim,
    )
    for guard, what in ((max_guard, "the split maxes"), (sum_guard, "the split sums"), (acc_guard, "the split accs")):
        _check_guard(guard, what)
    out, guard = _guarded(q.shape, UNWRITTEN, q.dtype, q.device)
    launch(
        merge_kernel,
        (num_seqs * num_heads,),
        out_ptr=out,
        max_ptr=maxes,
        sum_ptr=sums,
        acc_ptr=accs,
        NUM_SPLITS=num_splits,
        SPLITS_PAD=triton.next_power_of_2(num_splits),
        HEAD_DIM=head_dim,
    )
    _check_guard(guard, "the output")
    return out


def paged_decode(q, k_pool, v_pool, block_tables, context_lens, num_splits: int = 1) -> torch.Tensor:
    """labkit's kernels: one program per (sequence, KV head), or split-KV with ``num_splits`` > 1."""
    if num_splits == 1:
        return launch_paged_decode(paged_decode_kernel, q, k_pool, v_pool, block_tables, context_lens)
    return launch_split_kv(
        split_kv_kernel, merge_splits_kernel, q, k_pool, v_pool, block_tables, context_lens, num_splits
    )


def decode_tables(batch: PagedBatch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode rows' block tables (padded with block 0) and context lengths as int32, built once per step."""
    cached = batch.scratch.get("decode_tables")
    if cached is None:
        decodes = batch.sequences[: batch.num_decodes]
        width = max(len(seq.block_table) for seq in decodes)
        tables = [seq.block_table + [0] * (width - len(seq.block_table)) for seq in decodes]
        cached = batch.scratch["decode_tables"] = (
            torch.tensor(tables, dtype=torch.int32, device=device),
            torch.tensor([seq.context_len for seq in decodes], dtype=torch.int32, device=device),
        )
    return cached


def decode_attention(decode: Callable[..., torch.Tensor] = paged_decode) -> Callable[..., torch.Tensor]:
    """An attention function for the engine (``LLM(model, attention=decode_attention())``): the step's decode
    rows through ``decode(q, k_pool, v_pool, block_tables, context_lens)`` (labkit's kernel by default, or
    yours), the longer rows through labkit's :func:`~labkit.kv.paged_attention.paged_attention`."""

    def attention(layer: int, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch: PagedBatch):
        num_decodes = batch.num_decodes
        if not num_decodes:
            return paged_attention(layer, q, k_pool, v_pool, batch)
        out = q.new_empty(q.shape) if num_decodes == q.shape[0] else paged_attention(layer, q, k_pool, v_pool, batch)
        tables, lengths = decode_tables(batch, q.device)
        out[:num_decodes] = decode(q[:num_decodes], k_pool, v_pool, tables, lengths)
        return out

    return attention
