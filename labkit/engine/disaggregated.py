"""Prefill on one engine, decode on another, in one process, each request handed over with its KV cache: the same
greedy tokens as one engine (the simulator's :mod:`labkit.sim.disagg` prices the link between two pools).
"""

from __future__ import annotations

from collections.abc import Sequence

from labkit.engine.fleet import serve_engines
from labkit.engine.llm import LLM
from labkit.engine.request import Request, RequestOutput
from labkit.models.tokens import Prompt
from labkit.sampling_params import SamplingParams


def serve_disaggregated(
    prefill: LLM,
    decode: LLM,
    prompts: Sequence[Prompt],
    params: SamplingParams | Sequence[SamplingParams] | None = None,
) -> list[RequestOutput]:
    """Serve ``prompts`` with ``prefill`` computing every prompt and ``decode`` every token after the first; the
    outputs come back in the order given. The two engines take turns as a fleet in this process, every prompt
    arriving at time 0 on ``prefill``; each request is handed over as soon as its first token is out, or, while
    the decode engine has no free seat or blocks, later, with its longer KV (the prefill engine decodes it meanwhile).
    """
    all_params = list(params) if isinstance(params, Sequence) else [params or SamplingParams()] * len(prompts)
    if len(all_params) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts need as many sampling params, got {len(all_params)}")
    if any(sp.n > 1 for sp in all_params):
        raise ValueError("serve_disaggregated answers each prompt once: give SamplingParams with n=1")

    def hand_over() -> None:
        for request in prefill.core.ready_to_hand_over():
            if decode.can_import(request.num_computed_tokens):
                decode.import_request(prefill.export_request(request.request_id))

    def make(index: int) -> Request:
        return prefill.request(prompts[index], all_params[index], request_id=str(index), arrival_time=0.0)

    _, finished = serve_engines([prefill, decode], None, [0.0] * len(prompts), make, after_step=hand_over)
    return [finished[str(index)] for index in range(len(prompts))]
