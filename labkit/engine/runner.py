"""Turn one scheduled step into one forward pass over a ragged batch, and pick the next tokens.

The scheduler said "request r computes n new tokens". The runner flattens all of them into
one batch of T tokens (prefill chunks and decodes of different lengths side by side), tells
the paged cache where each new token's K/V goes and which blocks each sequence reads (a
:class:`~labkit.kv.paged.PagedBatch` handed to attention as an argument), runs
``model.forward`` once, and samples a token for each request the engine core named as a
sampler (its missing tokens are now all computed: the end of a prompt, or a decode).
"""

from __future__ import annotations

from functools import partial

import torch

from labkit.engine.core import Batch
from labkit.engine.request import Request
from labkit.kv.block_allocator import BlockAllocator
from labkit.kv.paged import PagedBatch, PagedKVCache, SequenceSlice
from labkit.sampling import make_generator, sample


class ModelRunner:
    """Owns the model and the KV pools; ``execute`` runs one step."""

    def __init__(self, model, cache: PagedKVCache):
        self.model = model
        self.cache = cache
        self.generators: dict[str, torch.Generator | None] = {}

    def execute(self, batch: Batch, blocks: BlockAllocator) -> dict[str, int]:
        """Compute ``n`` new tokens for each (request, n) of the batch; return sampler id -> sampled token."""
        work = sorted(batch.work, key=_row_order)
        ids, positions, sequences, last_rows, samplers = [], [], [], [], []
        for request, num_new in work:
            start = request.num_computed_tokens
            ids.extend(request.all_token_ids[start : start + num_new])
            positions.extend(range(start, start + num_new))
            sequences.append(
                SequenceSlice(len(ids) - num_new, num_new, start + num_new, blocks.block_table(request.request_id))
            )
            if request.request_id in batch.samplers:
                last_rows.append(len(ids) - 1)
                samplers.append(request)
        device = self.model.device
        paged = PagedBatch.build(sequences, self.cache.block_size, device, self.model.dtype)
        logits = self.model.forward(
            torch.tensor(ids, device=device),
            torch.tensor(positions, device=device),
            partial(self.cache.attend, batch=paged),
            torch.tensor(last_rows, dtype=torch.long, device=device),
        )
        if not samplers:
            return {}
        generators = [self._generator(request) for request in samplers]
        tokens = sample(logits, [request.params for request in samplers], generators).tolist()
        return {request.request_id: token for request, token in zip(samplers, tokens)}

    def _generator(self, request: Request) -> torch.Generator | None:
        if request.request_id not in self.generators:
            self.generators[request.request_id] = make_generator(request.params, self.model.device)
        return self.generators[request.request_id]

    def release(self, request_id: str) -> None:
        """Forget a finished request's random stream."""
        self.generators.pop(request_id, None)


def _row_order(item: tuple[Request, int]) -> tuple[bool, int]:
    """One-token rows (decodes) first, longest context first, so paged attention can group them."""
    request, num_new = item
    return num_new != 1, -request.num_computed_tokens if num_new == 1 else 0
