"""The engine's settings in one object, and the one way to build an engine core from them.

:class:`EngineConfig` holds the dials, with vLLM's names and labkit's one set of defaults. The real
engine (:class:`labkit.engine.LLM`) and the simulator (:func:`labkit.sim.simulator.simulate`) both
turn it into a core with :func:`build_core`, so a setting means the same on either clock. Plain Python,
no torch: the simulator imports it.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from labkit.engine.core import EngineCore
from labkit.engine.interfaces import (
    Attention,
    BlockAllocator,
    PrefixCachingAllocator,
    Proposer,
    SchedulerPolicy,
    VictimChooser,
    check_parts,
    implements,
)
from labkit.engine.scheduler import SchedulerState, make_policy, token_budget
from labkit.kv.block_allocator import FreeListBlockAllocator
from labkit.kv.prefix_cache import PrefixCachingBlockAllocator
from labkit.kv.tier_policy import BACKENDS
from labkit.speculative import parse_speculative_config
from labkit.speculative.config import SpeculativeConfig
from labkit.trace import Trace

_COUNTS = ("max_num_seqs", "block_size")  # whole numbers >= 1
_OPTIONAL_COUNTS = ("max_model_len", "max_num_batched_tokens", "num_blocks", "trace_window")  # ... or None
_SWITCHES = ("enable_chunked_prefill", "enable_prefix_caching", "deterministic")  # True, False or None
# vLLM's kv_cache_dtype values that labkit stores: the model's dtype, bfloat16 or float8_e4m3fn (labkit.kv.fp8)
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8")
_DESCRIBED = (  # the settings describe() gives as they are, in this order
    "max_model_len max_num_seqs max_num_batched_tokens num_blocks block_size kv_cache_dtype enable_prefix_caching"
).split()


def setting(
    default: Any, help: str, *, flag: str | None = None, choices: tuple[str, ...] = (), metavar: str | None = None
) -> Any:
    """An :class:`EngineConfig` field that says itself once: what it means (``help``), its allowed values, and
    its ``vllm serve`` flag where that is not the field's name dashed; ``labkit serve`` makes its flags from these."""
    return field(default=default, metadata=dict(help=help, flag=flag, choices=choices, metavar=metavar))


@dataclass(frozen=True)
class EngineConfig:
    """The engine's dials (vLLM's names, except ``trace_window``); None means "the engine chooses".

    Checked when made, so a bad value is an error that names it. ``llm.config`` is the resolved one: every None
    the engine filled in and ``speculative_config`` parsed. The simulator ignores ``kv_offloading_size`` (its
    allocator keeps no K/V to spill), so a simulated run is the same with it or not.
    """

    max_model_len: int | None = setting(
        None, "most tokens (prompt + answer) of one request (default: the model's context; simulator: the longest)"
    )
    max_num_seqs: int = setting(64, "most requests in one step's batch (64)")
    max_num_batched_tokens: int | None = setting(None, "token budget of one step (default: the policy's own)")
    num_blocks: int | None = setting(
        None,
        "size the KV cache in blocks, directly (default: what --gpu-memory-utilization leaves room for)",
        flag="--num-gpu-blocks-override",
    )
    gpu_memory_utilization: float = setting(0.9, "share of the device's memory (or RAM) the KV cache may take (0.9)")
    block_size: int = setting(16, "tokens per KV-cache block (16)")
    kv_cache_dtype: str = setting(
        "auto",
        "KV cache storage: auto (the model's dtype, the default), bfloat16 (half an fp32 pool's bytes) or fp8 "
        "(float8_e4m3fn: twice the tokens of a 16-bit pool)",
        choices=KV_CACHE_DTYPES,
    )
    enable_chunked_prefill: bool | None = setting(
        None, "split long prompts over steps (on by default, as in vLLM V1, unless the policy given says otherwise)"
    )
    enable_prefix_caching: bool | None = setting(
        None, "reuse the KV blocks of a prompt prefix already computed (on by default, as in vLLM V1)"
    )
    speculative_config: dict | SpeculativeConfig | None = setting(
        None,
        "speculative decoding with vLLM's keys (labkit.speculative.config), as JSON on a command line, e.g. "
        '\'{"method": "ngram", "num_speculative_tokens": 3}\' (off by default)',
    )
    trace_window: int | None = setting(
        None, "labkit's own: keep only the last N steps (and finished requests) in the trace (default: all)"
    )
    kv_offloading_size: float | None = setting(
        None,
        "GiB of a slower tier that keeps the prefix blocks the KV pool evicts and reloads them on a hit "
        "(off by default; needs prefix caching)",
        metavar="GIB",
    )
    kv_offloading_backend: str = setting(
        "native",
        "the tier: native (host memory, as vLLM's) or disk (files in a temporary folder, labkit's own)",
        choices=BACKENDS,
    )
    deterministic: bool = setting(
        False,
        "batch-invariant kernels (labkit.batch_invariant): a request's tokens do not depend on what shares its "
        "step, how its prompt was chunked or whether its prefix was cached (vLLM: VLLM_BATCH_INVARIANT=1; "
        "off by default: it costs speed)",
    )

    def __post_init__(self) -> None:
        for name in _COUNTS + _OPTIONAL_COUNTS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_COUNTS:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                leave_out = " (or None to let the engine choose)" if name in _OPTIONAL_COUNTS else ""
                raise ValueError(f"{name} must be a whole number >= 1{leave_out}, got {value!r}")
        utilization = self.gpu_memory_utilization
        if isinstance(utilization, bool) or not isinstance(utilization, numbers.Real) or not 0 < utilization <= 1:
            raise ValueError(
                f"gpu_memory_utilization must be a share in (0, 1], got {utilization!r}; 0.9 is the default"
            )
        for setting in fields(self):  # a setting with allowed values takes one of them
            allowed, value = setting.metadata.get("choices"), getattr(self, setting.name)
            if allowed and (not isinstance(value, str) or value not in allowed):
                said = " or ".join(map(repr, allowed))
                raise ValueError(f"{setting.name} must be {said}, got {value!r}; {setting.metadata['help']}")
        for name in _SWITCHES:
            if getattr(self, name) not in (True, False, None):
                raise ValueError(
                    f"{name} must be True, False or None (the engine's default), got {getattr(self, name)!r}"
                )
        size = self.kv_offloading_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, numbers.Real) or not 0 < size < 1e12):
            raise ValueError(
                f"kv_offloading_size must be a number of GiB > 0 (e.g. 4), or None for no tier, got {size!r}"
            )
        if size is not None and self.enable_prefix_caching is False:
            raise ValueError(
                "kv_offloading_size keeps evicted prefix-cache blocks, so it needs prefix caching: "
                "leave enable_prefix_caching on, or kv_offloading_size None"
            )
        if not isinstance(self.speculative_config, (dict, SpeculativeConfig, type(None))):
            raise TypeError(
                "speculative_config must be a dict with vLLM's keys, e.g. "
                f'{{"method": "ngram", "num_speculative_tokens": 3}}, or None; got {type(self.speculative_config).__name__}'
            )

    def describe(self) -> dict:
        """The settings as plain values, for ``LLM.describe()`` and a trace's meta (JSON-safe)."""
        speculation = parse_speculative_config(self.speculative_config, simulated=True)
        return dict(
            {name: getattr(self, name) for name in _DESCRIBED},
            speculative_decoding="off" if speculation is None else speculation.describe(),
            kv_offloading="off"
            if self.kv_offloading_size is None
            else f"{self.kv_offloading_backend}, {self.kv_offloading_size:g} GiB",
            deterministic=bool(self.deterministic),
        )


SETTINGS = tuple(field.name for field in fields(EngineConfig))


def engine_config(config: EngineConfig | None = None, **settings: Any) -> EngineConfig:
    """``config`` (default: the defaults) with ``settings`` changed; a misspelt setting is an error naming it."""
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], SETTINGS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"unknown engine setting {unknown[0]!r}{hint}; the settings are {', '.join(SETTINGS)}")
    return replace(config or EngineConfig(), **settings)


def build_core(
    config: EngineConfig,
    eos_token_ids: Sequence[int],
    *,
    policy: str | SchedulerPolicy | None = None,
    block_allocator: type | BlockAllocator | None = None,
    proposer: Proposer | None = None,
    attention: Attention | None = None,
    choose_victim: VictimChooser | None = None,
) -> tuple[EngineCore, EngineConfig]:
    """The engine core ``config`` describes (policy, queues and block pool, step loop), and ``config`` resolved.

    The caller sets what only it knows: ``max_model_len`` (the model's context, or the longest request),
    ``num_blocks`` unless ``block_allocator`` is a ready instance (which decides its own size), and
    ``proposer`` for a parsed ``speculative_config``; the parts are :class:`~labkit.engine.llm.LLM`'s.
    """
    if config.max_model_len is None:
        raise ValueError("build_core needs config.max_model_len set: the model's context, or the longest request")
    if config.speculative_config is not None and proposer is None:
        raise ValueError("speculative_config is on, so build_core needs its proposer (the drafting side)")
    resolved_policy = resolve_policy(policy, config.enable_chunked_prefill)
    budget = token_budget(config.max_num_batched_tokens, config.max_model_len, resolved_policy.chunked)
    blocks = _make_allocator(block_allocator, config)
    caching = config.enable_prefix_caching
    if caching is None:  # on by default, as in vLLM V1, where the allocator can do it
        caching = implements(blocks, PrefixCachingAllocator)
    check_parts(
        blocks=blocks,
        policy=resolved_policy,
        attention=attention,
        choose_victim=choose_victim,
        proposer=proposer,
        enable_prefix_caching=caching,
    )
    state = SchedulerState(
        blocks,
        config.max_num_seqs,
        budget,
        config.max_model_len,
        enable_prefix_caching=caching,
        choose_victim=choose_victim,
    )
    core = EngineCore(resolved_policy, state, list(eos_token_ids), proposer=proposer)
    core.trace = Trace(window=config.trace_window)
    resolved = replace(
        config,
        max_num_batched_tokens=budget,
        num_blocks=blocks.num_blocks,
        block_size=blocks.block_size,
        enable_chunked_prefill=resolved_policy.chunked,
        enable_prefix_caching=caching,
    )
    return core, resolved


def resolve_policy(policy: str | SchedulerPolicy | None, enable_chunked_prefill: bool | None) -> SchedulerPolicy:
    """The policy object; chunked prefill by default, as in vLLM V1."""
    if policy is None:
        return make_policy("continuous" if enable_chunked_prefill is False else "chunked")
    resolved = make_policy(policy)
    if enable_chunked_prefill is not None and resolved.chunked != enable_chunked_prefill:
        raise ValueError(
            f"policy {resolved.name!r} contradicts enable_chunked_prefill={enable_chunked_prefill}; "
            "pass only one of them"
        )
    return resolved


def _make_allocator(block_allocator: type | BlockAllocator | None, config: EngineConfig) -> BlockAllocator:
    """The block pool: a ready instance as given, else the class built at the config's size."""
    if block_allocator is None:
        block_allocator = (
            FreeListBlockAllocator if config.enable_prefix_caching is False else PrefixCachingBlockAllocator
        )
    if not isinstance(block_allocator, type):
        return block_allocator  # a ready-made allocator decides its own size
    if config.num_blocks is None:
        raise ValueError("num_blocks is not set: pass num_blocks (the simulator needs it; the engine sizes it itself)")
    return block_allocator(config.num_blocks, config.block_size)
