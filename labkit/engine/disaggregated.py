"""Prefill on one engine, decode on another, in one process: each request handed over with its KV cache.

Why: it shows disaggregated serving's hand-off on real engines (the same greedy tokens as one engine), with
the K/V travelling as :class:`~labkit.kv.handoff.KVHandoff` objects through :meth:`LLM.export_request` and
:meth:`LLM.import_request`; the simulator's :mod:`labkit.sim.disagg` prices the link between two pools.
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.engine.llm import LLM
from labkit.engine.request import RequestOutput
from labkit.models.tokens import Prompt
from labkit.sampling_params import SamplingParams


def serve_disaggregated(
    prefill: LLM,
    decode: LLM,
    prompts: Sequence[Prompt],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[RequestOutput]:
    """Serve ``prompts`` with ``prefill`` computing every prompt and ``decode`` every token after the first:
    each request is handed over (:meth:`~labkit.engine.LLM.export_request`, then
    :meth:`~labkit.engine.LLM.import_request`) as soon as its first token is out. Both engines share this
    process and take turns; the outputs come back in the order given (a request whose first token ends it is
    answered by the prefill engine alone).

    A request the decode engine cannot take yet (no free seat or blocks) stays on the prefill engine, which
    keeps decoding it meanwhile; it is handed over, with its longer KV, once the decode engine has room.
    """
    all_params = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
    if len(all_params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many sampling params, got {len(all_params)}")
    prefill.start_run()
    decode.start_run()
    ids = [prefill.add_request(p, sp, request_id=str(i)) for i, (p, sp) in enumerate(zip(prompts, all_params))]
    finished: dict[str, RequestOutput] = {}
    while prefill.has_unfinished() or decode.has_unfinished():
        for engine in (prefill, decode):
            if engine.has_unfinished():
                finished.update((out.request_id, out) for out in engine.step() if out.finished)
        for request in prefill.core.ready_to_hand_over():
            if decode.can_import(request.num_computed_tokens):
                decode.import_request(prefill.export_request(request.request_id))
    return [finished[request_id] for request_id in ids]
