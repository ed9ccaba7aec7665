"""The arithmetic behind an honest kernel benchmark: a card's peak bandwidth, the splits that fill it, the fraction.

A decode kernel is judged by the bytes it moves over the seconds it takes, against what the card's
memory can move. Each figure here is worked out from what the card says about itself, never from its
name (an "H100 PCIe" reads 2.0 TB/s, an "H100 SXM" 3.35; a "GH200" is not an "H200"):

- **bytes**: what each path reads, with the K and V pools as two buffers (each counted once);
- **peak**: DRAM transfers data on both edges of its clock, so bytes per second = memory clock x bus
  width in bytes x 2 (``torch.cuda.get_device_properties`` gives the clock in kHz and the width in bits);
- **copy bandwidth**: a device-to-device copy reads and writes every byte, so it moves twice its size;
  what a plain copy reaches is what the card gives in practice (below its peak), printed beside it;
- **splits**: one program per (sequence, KV head) leaves most multiprocessors idle at a small batch;
  split-KV cuts each sequence into enough runs to give every multiprocessor two programs;
- **fraction of peak**: bytes counted over seconds, over the peak. Over 100% means the bytes counted were
  not the bytes the memory moved (a cache served them, or the same buffer was counted twice): a bug.

Pure functions of numbers, so they are tested without a GPU (tests/test_kernel_bench_math.py).
"""

from __future__ import annotations

import math

from labkit.kernels.traffic import DecodeShape, decode_bytes

PROGRAMS_PER_SM = 2  # two programs a multiprocessor: one waiting on memory, the other's loads in flight


def case_bytes(shape: DecodeShape) -> dict[str, int]:
    """What one benchmark case reads, per path, and its working set: ``kernel`` and ``gather`` (as
    :func:`~labkit.kernels.traffic.decode_bytes` counts them), ``sdpa`` (the contiguous keys and values once,
    the queries) and ``pools`` (the K pool and the V pool, two buffers, each holding its sequences' blocks once).

    The K and V pools are separate buffers, so each token's keys and values are two reads from DRAM; one
    buffer passed as both would be read once from DRAM and once from the cache, and counted twice."""
    row = shape.num_kv_heads * shape.head_dim * shape.dtype_bytes  # one token's keys (or values), all KV heads
    blocks = sum(-(-length // shape.block_size) for length in shape.context_lens)
    queries = len(shape.context_lens) * shape.num_heads * shape.head_dim * shape.dtype_bytes
    counts = decode_bytes(shape)
    return {
        "kernel": counts["kernel"],
        "gather": counts["gather"],
        "sdpa": 2 * sum(shape.context_lens) * row + queries,
        "pools": 2 * blocks * shape.block_size * row,
    }


def peak_from_properties(properties) -> float | None:
    """The card's DRAM bandwidth in bytes/s from its reported memory clock (kHz) and bus width (bits), or None
    where the properties do not report them (an older torch, a driver that leaves them 0)."""
    clock_khz = getattr(properties, "memory_clock_rate", 0) or 0
    bus_bits = getattr(properties, "memory_bus_width", 0) or 0
    if clock_khz <= 0 or bus_bits <= 0:
        return None
    return clock_khz * 1e3 * (bus_bits / 8) * 2  # double data rate: two transfers a clock


def copy_bandwidth(num_bytes: int, seconds: float) -> float:
    """Bytes/s a device-to-device copy of ``num_bytes`` moved: it reads each byte and writes it (2 x size)."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    return 2 * num_bytes / seconds


def splits_for_sms(sm_count: int, batch: int, kv_heads: int, blocks: int) -> int:
    """Split-KV runs per (sequence, KV head) that give each of ``sm_count`` multiprocessors ``PROGRAMS_PER_SM``
    programs, never more than the sequence's ``blocks`` (a split with no block reads nothing), at least 1."""
    for name, value in (("sm_count", sm_count), ("batch", batch), ("kv_heads", kv_heads), ("blocks", blocks)):
        if value < 1:
            raise ValueError(f"{name} must be 1 or more, got {value}")
    wanted = PROGRAMS_PER_SM * sm_count
    return max(1, min(blocks, math.ceil(wanted / (batch * kv_heads))))


def fraction_of_peak(num_bytes: int, seconds: float, peak: float) -> float:
    """The share of the card's ``peak`` bytes/s that moving ``num_bytes`` in ``seconds`` reached."""
    if seconds <= 0 or peak <= 0:
        raise ValueError(f"seconds and peak must be positive, got {seconds} and {peak}")
    return num_bytes / seconds / peak


def over_peak_warning(fraction: float, working_set: int, l2_bytes: int | None) -> str | None:
    """None while ``fraction`` is at most 1; else what went wrong, naming the likely cause."""
    if fraction <= 1:
        return None
    if l2_bytes and working_set <= l2_bytes:
        cause = (
            f"the working set ({working_set / 2**20:.1f} MiB) fits in the {l2_bytes / 2**20:.0f} MiB L2 cache, "
            "so the cache, not DRAM, served the bytes (flush the cache between runs)"
        )
    else:
        cause = (
            "the bytes counted are more than DRAM moved (a buffer read twice counted twice, e.g. one pool as K and V)"
        )
    return f"WARNING: {fraction:.0%} of the card's peak is impossible: {cause}"
