"""Serve a workload with the engine's own scheduler, on a clock that the cost model moves.

One scheduler, two clocks: the step loop (:class:`~labkit.engine.core.EngineCore`), the
policies, the queues and the block allocator are the engine's, unchanged, and so is the event
loop (:func:`simulate` is a fleet of one, :class:`~labkit.engine.fleet.Fleet`); only the
executor differs. Each step lasts what
:class:`~labkit.sim.cost_model.CostModel` says a pass over its tokens and KV reads takes,
and every request ends exactly at its workload's answer length. The result is the same
:class:`~labkit.trace.Trace` the engine writes, so metrics and plots work on either, and a
run of an 8B model on an H100 takes seconds on a laptop.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tqdm.auto import tqdm

from labkit.engine.config import EngineConfig, build_core, engine_config
from labkit.engine.core import Batch, EngineCore, Executor, StepOutcome
from labkit.engine.fleet import Arrivals, Fleet
from labkit.engine.interfaces import SchedulerPolicy
from labkit.engine.request import Request
from labkit.sampling_params import SamplingParams
from labkit.sim.cost_model import CostModel, ModelSpec, conversations_that_fit
from labkit.sim.hardware import Hardware
from labkit.sim.spec_proposer import SimulatedProposer
from labkit.speculative import parse_speculative_config
from labkit.trace import Trace
from labkit.workloads import RequestSpec, Workload

PLACEHOLDER_TOKEN = 0  # the cost model never looks at token values; prefix caching compares them
NO_END_TOKENS: list[int] = []  # answers end at their workload length, never at an end token


def blocks_that_fit(hardware: Hardware, model: ModelSpec, memory_fraction: float = 0.9, block_size: int = 16) -> int:
    """KV blocks left on ``hardware`` beside ``model``'s weights: the capacity planner's division, per block."""
    return conversations_that_fit(hardware.memory_bytes, memory_fraction, model, block_size)


def prompt_token_ids(spec: RequestSpec, index: int, prefix_markers: dict[str, int]) -> list[int]:
    """The entry's token ids if it carries them, else synthetic ones that share exactly what the spec says.

    A synthetic prompt is its shared prefix (a marker for the ``prefix_id``, then placeholders)
    and then its own part (a marker for the request, ``index``, then placeholders): requests
    with one prefix id hold the same ids for that prefix, and no others do.
    """
    if isinstance(spec.prompt, list) and spec.prompt and isinstance(spec.prompt[0], int):
        return list(spec.prompt)
    ids = []
    if spec.prefix_len:
        assert spec.prefix_id is not None, "a RequestSpec with a prefix_len has a prefix_id"
        marker = prefix_markers.setdefault(spec.prefix_id, -1 - len(prefix_markers))
        ids = [marker] + [PLACEHOLDER_TOKEN] * (spec.prefix_len - 1)
    if spec.prompt_len > spec.prefix_len:
        ids += [index + 1] + [PLACEHOLDER_TOKEN] * (spec.prompt_len - spec.prefix_len - 1)
    return ids


def _request(spec: RequestSpec, token_ids: list[int]) -> Request:
    """An engine request for a workload entry that stops after exactly ``output_len`` tokens."""
    params = SamplingParams(max_tokens=spec.output_len, ignore_eos=True)
    return Request(spec.request_id, token_ids, params, spec.arrival_time)


def workload_arrivals(workload: Workload) -> Arrivals:
    """A workload's requests, each made (tokens from :func:`prompt_token_ids`) when the fleet's clock reaches it."""
    prefix_markers: dict[str, int] = {}

    def make(index: int) -> Request:
        spec = workload[index]
        return _request(spec, prompt_token_ids(spec, index, prefix_markers))

    return Arrivals([spec.arrival_time for spec in workload], make)


def serve_simulated(fleet: Fleet, workload: Workload, desc: str, use_tqdm: bool = False) -> None:
    """Serve ``workload`` on ``fleet`` of simulated cores; ``use_tqdm``: with a bar of the requests done."""
    with tqdm(total=len(workload), desc=desc, disable=not use_tqdm) as bar:

        def done(_: int, outcome: StepOutcome) -> None:  # requests finished or refused
            bar.update(len(outcome.rejected) + sum(request.is_finished for request in outcome.progressed))

        fleet.serve(workload_arrivals(workload), done if use_tqdm else None)  # no bar, no counting: runs stay fast


def simulated_core(
    workload: Workload,
    cost: CostModel,
    policy: str | SchedulerPolicy | None = None,
    *,
    config: EngineConfig | None = None,
    allreduce_s_per_token: float = 0.0,
    **settings: Any,
) -> tuple[EngineCore, Executor]:
    """The engine core :func:`simulate` runs for ``workload``, and the cost-model executor that times its steps.

    One replica of :func:`labkit.sim.fleet.simulate_fleet` is one of these. ``allreduce_s_per_token``
    adds a tensor-parallel replica's all-reduces to every pass (seconds per token it computes,
    :func:`labkit.capacity.parallel.tensor_split`'s figure); 0 on one GPU.
    """
    requested = engine_config(config, **settings)
    if requested.num_blocks is None:
        raise ValueError(
            "simulate needs num_blocks (the simulator has no device memory to size the pool from); "
            "get it for a real card from blocks_that_fit(hardware, model)"
        )
    speculation = parse_speculative_config(requested.speculative_config, simulated=True)
    proposer = None if speculation is None else SimulatedProposer(speculation)
    sized = replace(
        requested,
        max_model_len=requested.max_model_len or int(max(workload.prompt_lens + workload.output_lens)),
        speculative_config=speculation,
    )
    core, resolved = build_core(sized, NO_END_TOKENS, policy=policy, proposer=proposer)
    core.trace.meta = dict(
        simulated=True,
        workload=workload.name,
        policy=core.policy.name,
        cost_model=vars(cost),
        **resolved.describe(),
    )
    if allreduce_s_per_token:
        core.trace.meta["allreduce_s_per_token"] = allreduce_s_per_token

    def execute(batch: Batch, start: float) -> tuple[dict[str, int | list[int]], float]:
        """The cost-model executor: no tokens computed, only the pass's duration (and drawn acceptances)."""
        work = [(new, request.num_computed_tokens) for request, new in batch.work]  # per sequence: windows cap each
        end = start + cost.step_time(work) + allreduce_s_per_token * batch.num_tokens
        if proposer is None:
            return dict.fromkeys(batch.samplers, PLACEHOLDER_TOKEN), end
        end += proposer.drafting_time(batch)
        return {request_id: proposer.verify(batch, request_id) for request_id in batch.samplers}, end

    return core, execute


def simulate(
    workload: Workload,
    cost: CostModel,
    policy: str | SchedulerPolicy | None = None,
    *,
    config: EngineConfig | None = None,
    use_tqdm: bool = False,
    **settings: Any,
) -> Trace:
    """Run ``workload`` through ``policy`` with step times from ``cost``; return the trace.

    The settings are :class:`~labkit.engine.config.EngineConfig`'s, as keywords
    (``num_blocks=4096, max_num_seqs=64``) or a ``config`` (a real engine's ``llm.config``
    simulates that engine); they mean what they mean for :class:`labkit.engine.LLM`, with the
    same defaults, except that ``max_model_len`` defaults to the longest request in the workload
    and ``num_blocks`` must be given: get it for a real card from :func:`blocks_that_fit`. Prefix
    caching sees the prefixes the workload declares (see :func:`prompt_token_ids`).

    ``speculative_config`` simulates speculative decoding: ``{"method": "ngram", "num_speculative_tokens":
    k, "acceptance_rate": a}``. Every decoding request verifies up to k drafts in its step (1 + k tokens
    priced by the cost model), each accepted with probability ``a`` until the first rejection (a seeded
    draw, so runs repeat); rejected KV is rolled back as in the engine. ``"method": "draft_model"`` with
    ``"model"``: the draft's :class:`CostModel` adds its k one-token passes over the speculating requests.
    """
    core, execute = simulated_core(workload, cost, policy, config=config, **settings)
    serve_simulated(Fleet([(core, execute)]), workload, f"simulate ({core.policy.name})", use_tqdm)
    return core.trace
