"""What :class:`~labkit.engine.llm.LLM` builds beside its core (:func:`~labkit.engine.config.build_core`'s, shared
with the simulator): the model, the drafting side, a KV pool sized to the device, its tensors and its slower tier.
Each is a function of the settings, so ``LLM.__init__`` reads as the list of steps it is.
"""

from __future__ import annotations

from dataclasses import replace
from typing import cast

from labkit.engine.config import EngineConfig
from labkit.engine.interfaces import Attention, BlockAllocator, Proposer, TieredPrefixCachingAllocator, require
from labkit.kv.fp8 import kv_storage_dtype
from labkit.kv.paged_cache import PagedKVCache
from labkit.kv.pool_sizing import kv_pool_size
from labkit.kv.prefix_cache import ReloadPolicy
from labkit.kv.tier import KVTier, make_tier
from labkit.speculative import parse_speculative_config
from labkit.speculative.config import SpeculativeConfig
from labkit.speculative.proposers import DraftModelProposer, NgramProposer


def resolve_model(model):
    """A labkit model as given, or the one a checkpoint name (None: the default model) loads."""
    from labkit.models import load_model

    if model is None or isinstance(model, str):
        return load_model() if model is None else load_model(model)
    return model


def model_len(asked: int | None, model) -> int:
    """The asked ``max_model_len``, else the model's context; never more than the context."""
    context = model.config.max_position_embeddings
    max_model_len = asked or context
    if max_model_len > context:
        raise ValueError(f"max_model_len={max_model_len} exceeds the model's context of {context}; lower it")
    return max_model_len


def speculation(speculative_config, target) -> tuple[SpeculativeConfig | None, Proposer | None]:
    """The checked ``speculative_config`` (its draft model loaded) and its drafting side; None, None without it."""
    config = parse_speculative_config(speculative_config)
    if config is None:
        return None, None
    if config.method == "ngram":
        return config, NgramProposer(config)
    draft = resolve_model(config.model)
    config = replace(config, model=draft)
    return config, DraftModelProposer(config, draft, target)


def pool_blocks(
    config: EngineConfig, max_model_len: int, block_allocator: type | BlockAllocator | None, model
) -> tuple[int | None, str | None]:
    """``num_blocks`` as given, or what the device's memory holds beside the model (vLLM's sizing) and why;
    None for a ready-made allocator, which decides its own size."""
    if config.num_blocks is not None or not (block_allocator is None or isinstance(block_allocator, type)):
        return config.num_blocks, None
    storage = kv_storage_dtype(config.kv_cache_dtype, model.dtype)  # fp8: 1 byte per value
    return kv_pool_size(
        model.config.kv_bytes_per_token(storage),
        config.block_size,
        model.device,
        config.gpu_memory_utilization,
        config.max_num_seqs * max_model_len,
        kv_cache_dtype=config.kv_cache_dtype,
    )


def kv_cache(model, blocks: BlockAllocator, attention: Attention, kv_cache_dtype: str) -> PagedKVCache:
    """The K/V pools the allocator's blocks index, one pair per layer, in the model's shape."""
    cfg = model.config
    return PagedKVCache(
        cfg.num_layers,
        blocks.num_blocks,
        blocks.block_size,
        cfg.num_kv_heads,
        cfg.head_dim,
        model.device,
        model.dtype,
        attention,
        kv_cache_dtype=kv_cache_dtype,
    )


def attach_tier(
    config: EngineConfig, cache: PagedKVCache, blocks: BlockAllocator, reload_policy: ReloadPolicy | None
) -> KVTier | None:
    """The slower tier ``kv_offloading_size`` asks for, attached to the allocator; None when it is off."""
    if config.kv_offloading_size is None:
        if reload_policy is not None:
            raise ValueError("reload_policy is given but no tier is on: set kv_offloading_size (GiB) too")
        return None
    if not config.enable_prefix_caching:
        raise ValueError("kv_offloading_size keeps evicted prefix-cache blocks: it needs prefix caching on")
    require(blocks, "kv offloading")
    tier = make_tier(config.kv_offloading_backend, config.kv_offloading_size, cache)
    cast(TieredPrefixCachingAllocator, blocks).attach_tier(tier, reload_policy)
    return tier
