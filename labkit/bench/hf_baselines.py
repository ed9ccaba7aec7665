"""The baselines: Hugging Face ``generate``, one request at a time and in static batches.

Each run is recorded as a labkit Trace (token times from a logits processor that notes
the clock at every step), so the same metrics describe the baselines and labkit's engine.
"""

from __future__ import annotations

import time

import torch

from labkit.trace import RequestRecord, StepRecord, Trace


class StepClock:
    """A logits processor that only notes when each generation step's logits are ready."""

    def __init__(self, clock):
        self.clock = clock
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(self.clock())
        return scores


def hf_static_batches(model, prompts: list[list[int]], output_lens: list[int], batch_size: int, name: str) -> Trace:
    """Serve the requests in arrival order, ``batch_size`` at a time, with ``hf.generate``.

    Left padding and an attention mask let prompts of different lengths share a batch;
    every batch runs until its longest answer is done (``min_new_tokens`` forces the
    intended length, like ``ignore_eos``). A member that is already done holds its slot.
    """
    from transformers import LogitsProcessorList

    trace = Trace(meta={"engine": name, "batch_size": batch_size})
    start = time.perf_counter()
    clock = lambda: time.perf_counter() - start  # noqa: E731 - a tiny closure reads best here
    pad = model.config.eos_token_ids[0]
    for first in range(0, len(prompts), batch_size):
        batch = list(range(first, min(first + batch_size, len(prompts))))
        ids, mask = _left_padded([prompts[i] for i in batch], pad)
        steps = max(output_lens[i] for i in batch)
        step_clock = StepClock(clock)
        batch_start = clock()
        with torch.inference_mode():
            model.hf.generate(
                ids.to(model.device),
                attention_mask=mask.to(model.device),
                do_sample=False,
                max_new_tokens=steps,
                min_new_tokens=steps,
                pad_token_id=pad,
                logits_processor=LogitsProcessorList([step_clock]),
            )
        _record_batch(trace, batch, prompts, output_lens, batch_start, step_clock.times)
    return trace


def _left_padded(prompts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The prompts as one batch of token ids padded on the left with ``pad``, and the mask of the real tokens."""
    longest_prompt = max(len(prompt) for prompt in prompts)
    ids = torch.full((len(prompts), longest_prompt), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, longest_prompt - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest_prompt - len(prompt) :] = 1
    return ids, mask


def _record_batch(
    trace: Trace,
    batch: list[int],
    prompts: list[list[int]],
    output_lens: list[int],
    batch_start: float,
    step_times: list[float],
) -> None:
    """Write one ``generate`` call into the trace: each request's token times, and a step per token time in
    which the members still answering ran (every member of the batch holds its slot to the end)."""
    for i in batch:
        trace.requests.append(
            RequestRecord(
                request_id=str(i),
                arrival_time=0.0,
                prompt_len=len(prompts[i]),
                first_scheduled_time=batch_start,
                token_times=step_times[: output_lens[i]],
                finish_time=step_times[output_lens[i] - 1],
                finish_reason="length",
            )
        )
    previous = batch_start
    for step, at in enumerate(step_times):
        active = [str(i) for i in batch if output_lens[i] > step]
        prefill = sum(len(prompts[i]) for i in batch) if step == 0 else 0
        trace.steps.append(
            StepRecord(
                index=len(trace.steps),
                start=previous,
                end=at,
                scheduled={rid: (len(prompts[int(rid)]) if step == 0 else 1) for rid in active},
                num_prefill_tokens=prefill,
                num_decode_tokens=0 if step == 0 else len(active),
                slots_held=len(batch),
                num_waiting=len(prompts) - batch[-1] - 1,
            )
        )
        previous = at
