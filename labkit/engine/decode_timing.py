"""How long the engine's decode steps take for a batch of a given size and context: what a dtype, a quantization
or a kernel is judged by, end to end (the benchmarks and `labkit serve`'s choices of dtype and int8 kernel time it)."""

from __future__ import annotations

import statistics

import torch

from labkit.engine.llm import LLM
from labkit.sampling_params import SamplingParams


def labkit_decode_ms(model, batch_size: int, context: int, repeats: int) -> float:
    """Median duration of the engine's decode-only steps, as its own trace records them."""
    return decode_ms_in_turns({"model": model}, batch_size, context, repeats)["model"]


def decode_ms_in_turns(models: dict, batch_size: int, context: int, repeats: int) -> dict[str, float]:
    """:func:`labkit_decode_ms` of each of ``models`` (by name), their steps taken in turns (one step of each, then
    the next), so that a busy moment of the machine slows them all alike."""
    length, engines = context + repeats + 2, {}
    for name, model in models.items():
        engines[name] = llm = LLM(
            model,
            max_num_seqs=batch_size,
            max_model_len=length,
            num_blocks=batch_size * (length // 16 + 2),
            enable_chunked_prefill=False,
        )
        for row in random_prompts(model, batch_size, context).tolist():
            llm.add_request(row, SamplingParams(max_tokens=repeats + 1, ignore_eos=True), arrival_time=0.0)
    while any(llm.has_unfinished() for llm in engines.values()):
        for llm in engines.values():
            if llm.has_unfinished():
                llm.step()
    return {
        name: 1e3 * statistics.median(s.duration for s in llm.trace.steps if s.num_prefill_tokens == 0)
        for name, llm in engines.items()
    }


def random_prompts(model, batch_size: int, context: int) -> torch.Tensor:
    """The same seeded token ids for HF and labkit, drawn from the model's vocabulary."""
    return torch.randint(0, model.config.vocab_size, (batch_size, context), generator=torch.Generator().manual_seed(0))
