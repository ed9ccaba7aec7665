"""The two numbers of an accelerator that decide serving speed, for common parts and this machine.

A forward pass either waits for bytes to cross the memory link (``bandwidth``) or for the
arithmetic units to finish (``flops``). Everything else about a chip matters less for a
first estimate, so a :class:`Hardware` holds those two rates plus the memory size.

The presets are vendors' published peak figures (dense BF16 tensor rate, no sparsity;
peak memory bandwidth). Real kernels reach a fraction of them: treat the presets as
ceilings and :func:`probe_this_machine` as what one machine actually does.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported only by the probe, so presets and plans load fast
    import torch

GB = 1e9
TB = 1e12
TFLOPS = 1e12

# Dense kernels at serving shapes reach about half the published arithmetic peak (the lesson's A100
# figure, 150 of 312 TFLOP/s, is the same share); the memory link gets close to its datasheet rate.
ACHIEVABLE_FLOPS_FRACTION = 0.5


@dataclass(frozen=True)
class Hardware:
    """One accelerator: memory size (bytes), memory bandwidth (bytes/s), arithmetic rate (FLOP/s)."""

    name: str
    memory_bytes: float
    bandwidth: float
    flops: float
    source: str = ""
    interconnect_bandwidth: float = 0.0  # bytes/s each way to the other GPUs of a node (NVLink); 0: none known
    flops_achievable: bool = False  # True: ``flops`` is a rate kernels reach (measured or so quoted), not a peak
    fp8_tensor_cores: bool = (
        False  # True: its matrix units multiply fp8 at twice the 16-bit rate (Hopper, Ada, Blackwell)
    )

    def __post_init__(self) -> None:
        for field_name in ("memory_bytes", "bandwidth", "flops"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(
                    f"Hardware {self.name!r}: {field_name} must be positive, got {value!r}; "
                    "give the part's published figure or measure it with probe_this_machine()"
                )
        if self.interconnect_bandwidth < 0:
            raise ValueError(f"Hardware {self.name!r}: interconnect_bandwidth must be 0 or more")

    @property
    def achievable_flops(self) -> float:
        """The arithmetic rate kernels reach: ``flops`` itself when it is one, else half the datasheet peak."""
        return self.flops if self.flops_achievable else ACHIEVABLE_FLOPS_FRACTION * self.flops

    def achievable(self) -> Hardware:
        """This part rated as the planner rates every GPU: :attr:`achievable_flops`, datasheet bandwidth."""
        if self.flops_achievable:
            return self
        return replace(self, flops=self.achievable_flops, flops_achievable=True)

    def with_compute(self, precision: str) -> Hardware:
        """This part computing in ``precision``: ``"bf16"`` as it is, ``"fp8"`` at twice the rate where it can.

        fp8 arithmetic (weights and activations both in 8 bits, vLLM's ``--quantization fp8`` on a
        Hopper GPU) runs the tensor cores at double their 16-bit rate: the H100's 1,979 dense
        TFLOP/s against 989. A part without fp8 tensor cores (the A100) is refused: there fp8
        weights are widened to 16 bits before they are multiplied, which saves bytes, not arithmetic.
        """
        if precision in ("bf16", "fp16"):
            return self
        if precision != "fp8":
            raise ValueError(f"unknown compute precision {precision!r}; use bf16 or fp8")
        if not self.fp8_tensor_cores:
            raise ValueError(
                f"{self.name} has no fp8 tensor cores, so fp8 arithmetic runs no faster there: store the "
                "weights in 8 bits (--weights int8) for the bandwidth, or plan a GPU that has them (h100-sxm, "
                "h200, b200, rtx-4090, mi355x)"
            )
        return replace(self, name=f"{self.name}, fp8 arithmetic", flops=2 * self.flops)

    def __str__(self) -> str:
        return (
            f"{self.name}: {self.memory_bytes / GB:.0f} GB, {self.bandwidth / GB:,.4g} GB/s, "
            f"{self.flops / TFLOPS:.3g} TFLOP/s"
        )


_PEAK = "published peak, dense BF16 tensor rate without sparsity"
# Interconnect: NVIDIA quotes NVLink as total bandwidth per GPU, both directions together; an
# all-reduce sends and receives at once, so each direction gets half: A100 NVLink 3 600 GB/s
# (A100 datasheet), H100/H200 SXM NVLink 4 900 GB/s (H100 and H200 datasheets), B200 NVLink 5
# 1.8 TB/s (HGX B200 datasheet); the RTX 4090 has no NVLink: PCIe 4.0 x16, 64 GB/s both ways.
# MI355X: AMD quotes Infinity Fabric links without one per-GPU total, so none is assumed.
# fp8: each datasheet's dense fp8 figure is twice its bf16 one (H100 and H200 SXM 3,958 TFLOP/s with
# sparsity, 1,979 without; HGX B200 4.5 PFLOP/s dense per GPU; RTX 4090 330 TFLOP/s with fp32
# accumulate, Ada whitepaper; MI355X 5.0 PFLOP/s dense); the A100 has no fp8 tensor cores.

PRESETS: dict[str, Hardware] = {
    "a100-80gb": Hardware(
        "NVIDIA A100 80GB SXM",
        80 * GB,
        2.039 * TB,
        312 * TFLOPS,
        f"NVIDIA A100 Tensor Core GPU datasheet; {_PEAK}",
        interconnect_bandwidth=300 * GB,
    ),
    "h100-sxm": Hardware(
        "NVIDIA H100 SXM",
        80 * GB,
        3.35 * TB,
        989 * TFLOPS,
        f"NVIDIA H100 Tensor Core GPU datasheet (1,979 with sparsity); {_PEAK}",
        interconnect_bandwidth=450 * GB,
        fp8_tensor_cores=True,
    ),
    "h200": Hardware(
        "NVIDIA H200 SXM",
        141 * GB,
        4.8 * TB,
        989 * TFLOPS,
        f"NVIDIA H200 Tensor Core GPU datasheet (1,979 with sparsity); {_PEAK}",
        interconnect_bandwidth=450 * GB,
        fp8_tensor_cores=True,
    ),
    "b200": Hardware(
        "NVIDIA B200 (HGX)",
        180 * GB,
        8.0 * TB,
        2250 * TFLOPS,
        f"NVIDIA HGX B200 datasheet, per GPU (4.5 PFLOPS with sparsity); {_PEAK}",
        interconnect_bandwidth=900 * GB,
        fp8_tensor_cores=True,
    ),
    "rtx-4090": Hardware(
        "NVIDIA GeForce RTX 4090",
        24 * GB,
        1.008 * TB,
        165.2 * TFLOPS,
        f"NVIDIA Ada Lovelace architecture whitepaper (BF16 with FP32 accumulate); {_PEAK}",
        interconnect_bandwidth=32 * GB,
        fp8_tensor_cores=True,
    ),
    "mi355x": Hardware(
        "AMD Instinct MI355X",
        288 * GB,
        8.0 * TB,
        2500 * TFLOPS,
        f"AMD Instinct MI355X datasheet (5.0 PFLOPS with sparsity); {_PEAK}",
        fp8_tensor_cores=True,
    ),
}


def get_hardware(name: str | Hardware) -> Hardware:
    """A preset by name (``"h100-sxm"``), ``"this-machine"`` for a probe, or a Hardware passed through."""
    if isinstance(name, Hardware):
        return name
    key = name.lower()
    if key == "this-machine":
        return probe_this_machine()
    try:
        return PRESETS[key]
    except KeyError:
        raise ValueError(
            f"unknown hardware {name!r}; use one of {sorted(PRESETS) + ['this-machine']} "
            "or build a Hardware(name, memory_bytes, bandwidth, flops)"
        ) from None


def _best_seconds(work, device: torch.device, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls after one warm-up call: the least disturbed run."""
    from labkit.device import synchronize

    work()
    synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(megabytes: float = 256, device: torch.device | None = None, repeats: int = 3) -> float:
    """Bytes per second a large tensor copy moves (each byte is read once and written once)."""
    import torch

    from labkit.device import default_device

    device = device or default_device()
    count = max(1, int(megabytes * 1e6 / 4))
    source = torch.ones(count, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    seconds = _best_seconds(lambda: target.copy_(source), device, repeats)
    return 2 * source.numel() * source.element_size() / seconds


def measure_matmul_rate(
    size: int = 1024, dtype: torch.dtype | None = None, device: torch.device | None = None, repeats: int = 3
) -> float:
    """FLOP/s of one ``size`` x ``size`` matrix product (2 size**3 operations) in ``dtype``."""
    import torch

    from labkit.device import default_device

    device = device or default_device()
    dtype = dtype or torch.float32
    left = torch.randn(size, size, device=device).to(dtype)
    right = torch.randn(size, size, device=device).to(dtype)
    seconds = _best_seconds(lambda: torch.matmul(left, right), device, repeats)
    return 2 * size**3 / seconds


def _memory_bytes(device: torch.device) -> float:
    import torch

    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def probe_this_machine(
    device: torch.device | None = None, copy_megabytes: float | None = None, matmul_size: int | None = None
) -> Hardware:
    """Measure this machine's bandwidth and matmul rate in a second or two and return them as Hardware.

    ``flops`` is the rate in the dtype labkit computes in on this device (fp32 on CPU, bf16 on
    a GPU); the source note gives both the fp32 and the bf16 rate. Sizes default to ones that
    take well under a second each; pass smaller ones for a quicker, noisier figure.
    """
    import torch

    from labkit.device import default_device, default_dtype

    device = device or default_device()
    on_cpu = device.type == "cpu"
    copy_megabytes = copy_megabytes or (256 if on_cpu else 2048)
    matmul_size = matmul_size or (1024 if on_cpu else 8192)
    bandwidth = measure_bandwidth(copy_megabytes, device)
    working_dtype = default_dtype(device)
    # The other dtype's rate is only noted, at a quarter of the size: a CPU without native bf16
    # emulates it some 80x slower, and the full size would take ten seconds for a footnote.
    side_size = max(matmul_size // 4, 16)
    sizes = {torch.float32: matmul_size, torch.bfloat16: matmul_size, working_dtype: matmul_size}
    sizes.update({dtype: side_size for dtype in (torch.float32, torch.bfloat16) if dtype != working_dtype})
    rates = {dtype: measure_matmul_rate(size, dtype, device) for dtype, size in sizes.items()}
    note = (
        f"measured: copy of {copy_megabytes:g} MB; matmuls at {rates[torch.float32] / TFLOPS:.3g} TFLOP/s fp32 "
        f"({sizes[torch.float32]}x{sizes[torch.float32]}) and {rates[torch.bfloat16] / TFLOPS:.3g} TFLOP/s bf16 "
        f"({sizes[torch.bfloat16]}x{sizes[torch.bfloat16]}); flops is the {str(working_dtype).removeprefix('torch.')} rate"
    )
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"this machine ({device.type})"
    return Hardware(name, _memory_bytes(device), bandwidth, rates[working_dtype], note, flops_achievable=True)
