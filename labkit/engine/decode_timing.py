"""How long the engine's decode steps take for a batch of a given size and context: what a dtype, a quantization
or a kernel is judged by, end to end (the benchmarks and `labkit serve`'s choice of dtype both time it)."""

from __future__ import annotations

import statistics

import torch

from labkit.engine.llm import LLM
from labkit.sampling_params import SamplingParams


def labkit_decode_ms(model, batch_size: int, context: int, repeats: int) -> float:
    """Median duration of the engine's decode-only steps, as its own trace records them."""
    llm = LLM(
        model,
        max_num_seqs=batch_size,
        max_model_len=context + repeats + 2,
        num_blocks=batch_size * ((context + repeats + 2) // 16 + 2),
        enable_chunked_prefill=False,
    )
    params = SamplingParams(max_tokens=repeats + 1, ignore_eos=True)
    ids = random_prompts(model, batch_size, context)
    for row in ids.tolist():
        llm.add_request(row, params, arrival_time=0.0)
    while llm.has_unfinished():
        llm.step()
    decode_steps = [s.duration for s in llm.trace.steps if s.num_prefill_tokens == 0]
    return 1e3 * statistics.median(decode_steps)


def random_prompts(model, batch_size: int, context: int) -> torch.Tensor:
    """The same seeded token ids for HF and labkit, drawn from the model's vocabulary."""
    return torch.randint(0, model.config.vocab_size, (batch_size, context), generator=torch.Generator().manual_seed(0))
