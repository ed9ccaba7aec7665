"""GPU kernels in Triton: PagedAttention's decode kernel and its split-KV form, and the bytes they read.

- :mod:`~labkit.kernels.runtime`: Triton set up for this machine (its interpreter without a GPU) and the canary;
- :mod:`~labkit.kernels.paged_decode`: the kernels, their launchers, a PyTorch reference, and the attention
  function that plugs them into the engine;
- :mod:`~labkit.kernels.traffic`: bytes read per decode step, kernel against gather-then-SDPA;
- :mod:`~labkit.kernels.bench_math`: what scripts/kernel_bench.py scores a card by (its peak from its own
  properties, the splits that fill it, the share of peak).

Importing :mod:`~labkit.kernels.paged_decode` imports Triton (a couple of seconds); nothing else in labkit does.
"""
