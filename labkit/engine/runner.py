"""Turn one scheduled step into one forward pass over a ragged batch, and pick the next tokens.

The runner flattens every scheduled request's new tokens into one batch (prefill chunks and decodes side by
side), says where their K/V go and which blocks each sequence reads (a :class:`~labkit.kv.paged_batch.PagedBatch`,
handed to attention), runs ``model.forward`` once, and samples a token for each request the engine core named
as a sampler (the end of a prompt, or a decode), through its logits processors where its params ask for them.
"""

from __future__ import annotations

from functools import partial
from typing import cast

import torch

from labkit.engine.core import Batch
from labkit.engine.interfaces import BlockAllocator, TieredPrefixCachingAllocator
from labkit.engine.request import Request
from labkit.kv.paged_batch import PagedBatch, SequenceSlice
from labkit.kv.paged_cache import PagedKVCache
from labkit.kv.tier import KVTier, move_blocks
from labkit.sampling import filtered_probabilities, make_generator, process_logits, sample, token_logprob
from labkit.speculative import SpeculativeConfig, one_hot_probs


class ModelRunner:
    """Owns the model and the KV pools; ``execute`` runs one step."""

    def __init__(
        self,
        model,
        cache: PagedKVCache,
        speculative_config: SpeculativeConfig | None = None,
        tier: KVTier | None = None,
    ):
        self.model = model
        self.cache = cache
        self.tier = tier  # a slower tier for evicted prefix blocks (labkit.kv.tier), None when off
        self.speculative_config = speculative_config
        self.generators: dict[str, torch.Generator | None] = {}

    def execute(self, batch: Batch, blocks: BlockAllocator) -> dict[str, int | list[int]]:
        """Compute ``n`` new tokens for each (request, n) of the batch; return sampler id -> sampled token.

        A speculating sampler (it carries draft tokens) gets the logits of all its 1 + k positions in
        the same pass, and a list back: its accepted drafts and one token of the target's.
        """
        if self.tier is not None:  # before anything is written: spills out of the pool, reloads into it
            spills, reloads = cast(TieredPrefixCachingAllocator, blocks).take_tier_moves()
            move_blocks(self.cache, self.tier, spills, reloads)
        work = sorted(batch.work, key=_row_order)
        ids: list[int] = []  # every new token of the step, one flat batch
        positions: list[int] = []  # ... and each one's position in its own sequence
        sequences: list[SequenceSlice] = []  # where each request's tokens sit in the flat batch
        logit_rows: list[int] = []  # the rows whose logits a sampler needs
        samplers: list[Request] = []  # the requests that get a token this step
        for request, num_new in work:
            start = request.num_computed_tokens
            ids.extend((request.all_token_ids + request.spec_token_ids)[start : start + num_new])  # drafts last
            positions.extend(range(start, start + num_new))
            table = list(blocks.block_table(request.request_id))  # any sequence of ints, as a list
            sequences.append(SequenceSlice(len(ids) - num_new, num_new, start + num_new, table))
            if request.request_id in batch.samplers:
                num_rows = 1 + len(request.spec_token_ids)  # the last position, or every verified one
                logit_rows.extend(range(len(ids) - num_rows, len(ids)))
                samplers.append(request)
        device = self.model.device
        paged = PagedBatch.build(sequences, self.cache.block_size, device, self.model.dtype)
        logits = self.model.forward(
            torch.tensor(ids, device=device),
            torch.tensor(positions, device=device),
            partial(self.cache.attend, batch=paged),
            torch.tensor(logit_rows, dtype=torch.long, device=device),
        )
        if not samplers:
            return {}
        plain: list[Request] = []  # samplers without drafts: one token each, sampled together
        plain_rows: list[int] = []
        tokens: dict[str, int | list[int]] = {}
        row = 0
        for request in samplers:
            num_rows = 1 + len(request.spec_token_ids)
            if num_rows == 1:
                plain.append(request)
                plain_rows.append(row)
            else:
                tokens[request.request_id] = self._verify(request, logits[row : row + num_rows])
            row += num_rows
        if plain:
            generators = [self._generator(request) for request in plain]
            raw = logits[plain_rows]
            sampled = sample(self._processed(raw, plain), [request.params for request in plain], generators).tolist()
            tokens.update({request.request_id: token for request, token in zip(plain, sampled)})
            for request, token, row in zip(plain, sampled, raw):
                if request.params.logprobs is not None:
                    request.output_logprobs.append(token_logprob(row, token, request.params.logprobs))
        return tokens

    def _processed(self, raw: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """The rows to sample from: ``raw`` itself unless a request has logits processors, whose rows
        are then replaced by their processed ones (in float32; ``raw`` stays as it was, for logprobs)."""
        if not any(request.params.processes_logits for request in requests):
            return raw
        rows = raw.to(torch.float32, copy=True)
        eos = list(self.model.config.eos_token_ids)
        for i, request in enumerate(requests):
            p = request.params
            if p.processes_logits:
                stop_ids = list(p.stop_token_ids) + ([] if p.ignore_eos else eos)
                rows[i] = process_logits(raw[i], p, request.prompt_token_ids, request.output_token_ids, stop_ids)
        return rows

    def _verify(self, request: Request, logits: torch.Tensor) -> list[int]:
        """Speculative decoding: what the target makes of the drafts, scored in one pass."""
        config, draft = self.speculative_config, request.spec_token_ids
        assert config is not None, "a request carries drafts only when speculation is on"
        if request.params.greedy:
            return list(config.accept_greedy(list(draft), logits.argmax(dim=-1).tolist()))
        target_probs = torch.stack([filtered_probabilities(row, request.params) for row in logits])
        draft_probs = request.spec_draft_probs
        if draft_probs is None:
            draft_probs = one_hot_probs(draft, logits.shape[-1], device=logits.device)
        return list(
            config.accept_sampling(list(draft), draft_probs.to(logits.device), target_probs, self._generator(request))
        )

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
