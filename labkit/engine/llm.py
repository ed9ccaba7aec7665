"""The engine's front door: ``LLM(...).generate(prompts)`` offline, or step by step for the labs.

The step loop is :class:`~labkit.engine.core.EngineCore`, the one the simulator runs too, built from one
:class:`~labkit.engine.config.EngineConfig` by :func:`~labkit.engine.config.build_core`; this class adds the
model, the KV pools and the wall clock.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from typing import Any, Callable, Sequence, cast

from tqdm.auto import tqdm

from labkit.batch_invariant import batch_invariant_attention, batch_invariant_model
from labkit.engine import kv_transfer
from labkit.engine.config import EngineConfig, build_core, engine_config
from labkit.engine.core import Batch, EngineCore, Executor, StepOutcome
from labkit.engine.interfaces import Attention, BlockAllocator, SchedulerPolicy, VictimChooser
from labkit.engine.parts import (
    ReloadPolicy,
    attach_tier,
    kv_cache,
    model_len,
    pool_blocks,
    resolve_model,
    speculation,
)
from labkit.engine.quantization import quantize_for_serving
from labkit.engine.request import CompletionOutput, Request, RequestOutput
from labkit.engine.runner import ModelRunner
from labkit.kv.handoff import KVHandoff
from labkit.kv.paged_attention import paged_attention
from labkit.models.tokens import Prompt, encode_prompt
from labkit.sampling_params import SamplingParams
from labkit.trace import StepRecord, Trace


class LLM:
    """A serving engine over one model: chunked-prefill continuous batching on a paged KV cache by default.

    ``model``: a labkit model, a checkpoint name for :func:`labkit.models.load_model`, or None for the default
    one. The settings are :class:`~labkit.engine.config.EngineConfig`'s (each field says what it means), as
    keyword arguments (``LLM(max_num_seqs=8, num_blocks=64)``) or as a ``config`` (the two combine, the keywords
    win); ``llm.config`` is the resolved one, and ``describe()`` says how the KV pool was sized and why prefix
    caching is off, where the engine turned it off.

    The parts are plain arguments, so a lab can plug in a learner's own. ``policy`` is "static",
    "continuous", "chunked" or your own :class:`SchedulerPolicy`; ``enable_chunked_prefill`` picks
    between the last two when no policy is given. ``block_allocator`` is a class built as
    ``cls(num_blocks, block_size)`` or a ready instance (default: a prefix-caching one, or the plain
    :class:`FreeListBlockAllocator` with ``enable_prefix_caching=False``). Prefix caching is on by default,
    as in vLLM V1, and turned off for an allocator that cannot do it; asking for it with such an allocator
    is an error. ``attention`` is called as ``attention(layer, q, k_pool, v_pool, batch)``;
    ``choose_victim(state, request)`` names whom to preempt when blocks run out (default: the newest running
    request, lab 4); ``clock`` returns seconds (swap in a fake one to control arrivals in a test). Every part
    is checked once, here, against :mod:`labkit.engine.interfaces` for the features that are on.

    ``speculative_config`` turns on speculative decoding with vLLM's keys (:mod:`labkit.speculative.config`),
    e.g. ``{"method": "ngram", "num_speculative_tokens": 3}``: each decoding request then verifies up to k
    drafts in the step's one pass. The default model, SmolLM2-135M, is already the smallest of its family, so
    it has no smaller draft model: with it, use "ngram".

    ``reload_policy(prompt_tokens, cached_tokens, tier_blocks, block_size)`` picks the blocks worth reloading
    from the tier ``kv_offloading_size`` turns on (default: every one found; lab 12 has learners weigh measured
    costs); ``kv_tier`` is that tier (None when off). ``quantization="int8"`` (vLLM's name; off by default)
    computes the model's linears in int8 (:mod:`labkit.engine.quantization`; ``llm.quantization.describe()``
    says what was chosen and why).
    """

    def __init__(
        self,
        model=None,
        *,
        config: EngineConfig | None = None,
        policy: str | SchedulerPolicy | None = None,
        block_allocator: type | BlockAllocator | None = None,
        attention: Attention = paged_attention,
        clock: Callable[[], float] = time.perf_counter,
        choose_victim: VictimChooser | None = None,
        reload_policy: ReloadPolicy | None = None,
        quantization: str | None = None,
        **settings: Any,
    ):
        self.model, self.quantization = quantize_for_serving(resolve_model(model), quantization)
        requested = engine_config(config, **settings)
        if requested.deterministic:
            if attention is not paged_attention:
                raise ValueError("deterministic=True brings its own attention (batch-invariant); pass one or the other")
            self.model, attention = batch_invariant_model(self.model), batch_invariant_attention
        max_model_len = model_len(requested.max_model_len, self.model)
        spec_config, proposer = speculation(requested.speculative_config, self.model)
        num_blocks, self._pool_note = pool_blocks(requested, max_model_len, block_allocator, self.model)
        sized = replace(requested, max_model_len=max_model_len, num_blocks=num_blocks, speculative_config=spec_config)
        self.core, self.config = build_core(
            sized,
            self.model.config.eos_token_ids,
            policy=policy,
            block_allocator=block_allocator,
            proposer=proposer,
            attention=attention,
            choose_victim=choose_victim,
        )
        self.policy, self.state = self.core.policy, self.core.state
        blocks = self.state.blocks
        self._caching_note = (
            None
            if self.config.enable_prefix_caching or requested.enable_prefix_caching is False
            else f"off: the allocator {type(blocks).__name__} cannot cache prefixes"
        )
        cache = kv_cache(self.model, blocks, attention, self.config.kv_cache_dtype)
        self.kv_tier = attach_tier(self.config, cache, blocks, reload_policy)
        self.runner = ModelRunner(self.model, cache, spec_config, tier=self.kv_tier)
        self.last_step: StepRecord | None = None  # the latest step()'s record; None if it ran nothing
        self._clock = clock
        self._ids = itertools.count()
        self.start_run()

    # --- the clock and the record of a run ----------------------------------------------
    def now(self) -> float:
        """Seconds since the run started, on the engine's clock."""
        return self._clock() - self._start

    def start_run(self) -> None:
        """Restart the clock at 0 and begin a fresh trace; only between runs."""
        if self.core.has_unfinished():
            raise RuntimeError("cannot start a new run while requests are unfinished; finish them first")
        self._start = self._clock()
        self.core.trace = Trace(meta=self.describe(), window=self.config.trace_window)

    @property
    def trace(self) -> Trace:
        """The record of the current (or last) run."""
        return self.core.trace

    def describe(self) -> dict:
        """The setup, as written into each trace's meta: the model, the policy, the resolved settings
        (``config.describe()``) and why prefix caching is off, if the engine chose so."""
        setup = dict(
            model=self.model.config.name,
            device=str(self.model.device),
            dtype=str(self.model.dtype),
            policy=self.policy.name,
            quantization=self.quantization.quantization,
            **self.config.describe(),
        )
        if self._caching_note:
            setup["prefix_caching"] = self._caching_note
        if self._pool_note:
            setup["kv_pool"] = self._pool_note
        tier = getattr(self, "kv_tier", None)  # describe() also runs before the tier is made
        if tier is not None:
            setup["kv_tier"] = tier.stats()
        return setup

    @property
    def num_preemptions(self) -> int:
        """Preemptions since the engine was built, over all requests."""
        return self.state.num_preemptions

    # --- the step API ------------------------------------------------------------------
    def add_request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
    ) -> str:
        """Queue a prompt (text, chat messages or token ids); it joins once the clock passes ``arrival_time``."""
        params = params or SamplingParams()
        if params.n > 1:
            raise ValueError(
                f"SamplingParams(n={params.n}) asks for several answers, which generate() groups per prompt; "
                "in the step API add one request per answer (n=1, a seed each) yourself"
            )
        return self._add(prompt, params, request_id, arrival_time)

    def _add(self, prompt, params, request_id=None, arrival_time=None, parent_id=None) -> str:
        request = self.request(prompt, params, request_id, arrival_time, parent_id)
        self.core.add(request)
        return request.request_id

    def request(
        self,
        prompt: Prompt,
        params: SamplingParams | None = None,
        request_id: str | None = None,
        arrival_time: float | None = None,
        parent_id: str | None = None,
    ) -> Request:
        """The engine's request for a prompt, checked and tokenized but not queued (a fleet routes it first)."""
        params = params or SamplingParams()
        self.check_params(params)
        request_id = str(next(self._ids)) if request_id is None else str(request_id)
        token_ids = encode_prompt(self.model.tokenizer, prompt)
        arrival = self.now() if arrival_time is None else float(arrival_time)
        return Request(request_id, token_ids, params, arrival, prompt=prompt, parent_id=parent_id)

    def check_params(self, params: SamplingParams) -> None:
        """What only the engine can check: token ids within the vocabulary, and no extra that speculation lacks."""
        vocab_size = self.model.config.vocab_size
        outside = [token for token in (params.logit_bias or {}) if token >= vocab_size]
        if outside:
            raise ValueError(f"logit_bias names token id {outside[0]}, but the vocabulary has {vocab_size} ids")
        extras = {
            "logprobs": params.logprobs is not None,
            "logits processors (penalties, logit_bias, min_tokens)": params.processes_logits,
        }
        asked = [name for name, wanted in extras.items() if wanted]
        if asked and self.config.speculative_config is not None:
            raise ValueError(
                f"SamplingParams with {' and '.join(asked)} cannot be combined with speculative_config: the "
                "verifier accepts drafts from unprocessed logits and records no logprobs; run without speculation"
            )

    def has_unfinished(self) -> bool:
        return self.core.has_unfinished()

    def abort_request(self, request_id: str) -> bool:
        """Stop serving a request now (as vLLM's ``abort_request``): its KV blocks go back to the pool
        at once and it gets no more outputs. Returns False if no unfinished request has that id."""
        found = self.core.abort(str(request_id))
        self.runner.release(str(request_id))
        return found

    # --- hand-offs: prefill here, decode on another engine (see labkit.engine.kv_transfer) ------
    def export_request(self, request_id: str) -> KVHandoff:
        """Take a request out of this engine after its prefill, with its KV cache, for another's :meth:`import_request`."""
        return kv_transfer.export_request(self, request_id)

    def can_import(self, num_computed_tokens: int) -> bool:
        """Whether a hand-off of a request with this many computed tokens fits now (a free seat and blocks)."""
        return self.core.can_adopt(num_computed_tokens)

    def import_request(self, handoff: KVHandoff) -> str:
        """Continue a request another engine prefilled and exported; returns its request id."""
        return kv_transfer.import_request(self, handoff)

    def step(self) -> list[RequestOutput]:
        """Run one step; return an output for every request that got a token or finished (its record: ``last_step``)."""
        start = self.now()
        outcome = self.core.step(start, self._execute)
        if outcome.record is None and self.core.next_arrival is not None:  # idle: wait for the next arrival
            time.sleep(min(max(self.core.next_arrival - start, 0.0), 0.05))
        return self.collect(outcome)

    def as_replica(self) -> tuple[EngineCore, Executor]:
        """This engine's core and the executor that runs its steps on the model, for a :class:`~labkit.engine.fleet.Fleet`
        (which then steps it; hand each :class:`StepOutcome` back to :meth:`collect`)."""
        return self.core, self._execute

    def collect(self, outcome: StepOutcome) -> list[RequestOutput]:
        """After a step of this engine: note it, let finished requests' runner state go, and return an output for
        every request that got a token or finished."""
        self.last_step = outcome.record
        for request in outcome.progressed:
            if request.is_finished:
                self.runner.release(request.request_id)
        return [self._output(request) for request in outcome.rejected + outcome.progressed]

    def _execute(self, batch: Batch, start: float) -> tuple[dict[str, int | list[int]], float]:
        """The real executor: one forward pass over the batch, timed on the engine's clock."""
        return self.runner.execute(batch, self.state.blocks), self.now()  # the pass first, then the clock

    def _output(self, request: Request) -> RequestOutput:
        tokenizer = self.model.tokenizer
        text = None
        if request.is_finished and tokenizer is not None:
            text = tokenizer.decode(request.output_token_ids, skip_special_tokens=True)
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            list(request.output_token_ids),
            text,
            request.is_finished,
            request.finish_reason,
            request.message,
            request.num_preemptions,
            logprobs=list(request.output_logprobs) if request.params.logprobs is not None else None,
        )

    # --- offline use ---------------------------------------------------------------------
    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        arrival_times: Sequence[float] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Serve every prompt to the end and return their outputs in the order given.

        ``arrival_times`` (seconds from the start of this call) make requests trickle in;
        by default all arrive at once. The run's trace is in ``self.trace`` afterwards.
        """
        # one prompt or many: _is_single_prompt tells them apart at run time, the cast tells the type checker
        prompts = cast("list[Prompt]", [prompts] if _is_single_prompt(prompts) else list(prompts))
        params = sampling_params if isinstance(sampling_params, Sequence) else [sampling_params] * len(prompts)
        arrivals = list(arrival_times) if arrival_times is not None else [0.0] * len(prompts)
        if not len(params) == len(arrivals) == len(prompts):
            raise ValueError(
                f"{len(prompts)} prompts need as many sampling params and arrival times, "
                f"got {len(params)} and {len(arrivals)}"
            )
        self.start_run()
        groups = [self._add_answers(p, sp or SamplingParams(), t) for p, sp, t in zip(prompts, params, arrivals)]
        ids = [request_id for group in groups for request_id in group]
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(ids), desc=f"generate ({self.policy.name})", disable=not use_tqdm) as bar:
            while self.has_unfinished():
                for output in self.step():
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
                tokens = sum(r.output_len for r in self.trace.requests)
                bar.set_postfix(tok_per_s=f"{tokens / max(self.now(), 1e-9):.1f}", refresh=False)
        self.trace.meta["num_preemptions"] = sum(r.num_preemptions for r in self.trace.requests)
        return [_grouped([finished[i] for i in group]) for group in groups]

    def _add_answers(self, prompt, params: SamplingParams, arrival: float) -> list[str]:
        """One request per answer (``params.n`` of them), each with its own seed; the first one's prompt
        blocks are cached before the others join, so they compute only what is theirs (as vLLM's n)."""
        first = self._add(prompt, replace(params, n=1), arrival_time=arrival)
        siblings = [
            self._add(
                prompt,
                replace(params, n=1, seed=None if params.seed is None else params.seed + index),
                request_id=f"{first}.{index}",
                arrival_time=arrival,
                parent_id=first,
            )
            for index in range(1, params.n)
        ]
        return [first] + siblings


def serve_workload(llm: LLM, workload, use_tqdm: bool = False) -> Trace:
    """Serve a :class:`~labkit.workloads.Workload` on ``llm``, each request arriving when the workload says and
    answering exactly its intended length (``ignore_eos``); returns the run's trace (the labs, calibration and
    ``labkit bench`` all serve workloads this way)."""
    params = [SamplingParams(max_tokens=int(spec.output_len), ignore_eos=True) for spec in workload]
    llm.generate(
        [spec.prompt for spec in workload],
        params,
        arrival_times=[spec.arrival_time for spec in workload],
        use_tqdm=use_tqdm,
    )
    return llm.trace


def _is_single_prompt(prompts) -> bool:
    """A string, a chat (list of dicts) or a token list is one prompt; a list of those is many."""
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, list) and bool(prompts) and all(isinstance(p, (int, dict)) for p in prompts)


def _grouped(answers: list[RequestOutput]) -> RequestOutput:
    """One output per prompt: the first answer's fields, and every answer in ``outputs`` (vLLM's shape)."""
    first = answers[0]
    if len(answers) == 1:
        return first
    completions = [CompletionOutput(i, a.token_ids, a.text, a.finish_reason, a.logprobs) for i, a in enumerate(answers)]
    return replace(first, num_preemptions=sum(a.num_preemptions for a in answers), outputs=completions)
