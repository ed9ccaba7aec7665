"""A request moved between two engines after its prefill, with its K/V (:class:`~labkit.kv.handoff.KVHandoff`):
``LLM.export_request`` and ``LLM.import_request`` call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from labkit.engine.request import Request
from labkit.kv.handoff import KVHandoff, KVLayout, read_tokens, write_tokens
from labkit.sampling import make_generator

if TYPE_CHECKING:
    from labkit.engine.llm import LLM


def kv_layout(llm: LLM) -> KVLayout:
    """What a hand-off from or to this engine must match: the model, its KV shape, its dtypes."""
    cfg = llm.model.config
    return KVLayout(
        cfg.name, cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, str(llm.model.dtype), llm.config.kv_cache_dtype
    )


def export_request(llm: LLM, request_id: str) -> KVHandoff:
    """Take a request out of ``llm`` after its prefill, with its KV cache, for another engine's
    :func:`import_request`: its K/V are read through its block table, then its blocks go back to this pool.
    Raises ValueError, saying why, for a request still prefilling, waiting, finished or unknown."""
    request, table = llm.core.hand_over(str(request_id))
    count = request.num_computed_tokens
    cache = llm.runner.cache
    keys = [read_tokens(cache.k[layer], table, count) for layer in range(len(cache.k))]
    values = [read_tokens(cache.v[layer], table, count) for layer in range(len(cache.v))]
    # the blocks went back in hand_over, but nothing writes them before this engine's next step
    generator = llm.runner.generators.pop(request.request_id, None)
    request.mark_finished("handoff", llm.now())
    return KVHandoff(
        request.request_id,
        list(request.prompt_token_ids),
        list(request.output_token_ids),
        request.params,
        count,
        keys,
        values,
        kv_layout(llm),
        prompt=request.prompt,
        generator_state=None if generator is None else generator.get_state(),
    )


def import_request(llm: LLM, handoff: KVHandoff) -> str:
    """Continue on ``llm`` a request another engine prefilled (its :func:`export_request`): blocks are allocated
    here through the allocator, its K/V written into them in its table's order, and it decodes from its next step.
    Refused with a ValueError naming the difference when the KV layouts differ (model, layers, heads, dtypes,
    fp8 cache); a different block size is fine. Returns its request id."""
    mismatch = handoff.layout.mismatch(kv_layout(llm))
    if mismatch:
        raise ValueError(
            f"cannot import request {handoff.request_id!r}: {mismatch}; hand it to an engine built with the same "
            "model, dtype and kv_cache_dtype"
        )
    llm.check_params(handoff.params)
    now = llm.now()
    request = Request(handoff.request_id, list(handoff.prompt_token_ids), handoff.params, now, prompt=handoff.prompt)
    for token in handoff.output_token_ids:
        request.append_token(token, now)
    request.num_computed_tokens = handoff.num_computed_tokens
    table = llm.core.adopt(request)
    cache = llm.runner.cache
    for layer, (keys, values) in enumerate(zip(handoff.keys, handoff.values)):
        write_tokens(cache.k[layer], table, keys)
        write_tokens(cache.v[layer], table, values)
    if handoff.generator_state is not None:
        generator = make_generator(handoff.params, llm.model.device)
        if generator is not None:
            generator.set_state(handoff.generator_state)
        llm.runner.generators[request.request_id] = generator
    return request.request_id
