"""The drafting side the engine calls each step: prompt lookup, or a smaller draft model.

Both answer ``propose(request, k) -> (draft tokens, draft probabilities or None)`` and carry the
rollback the engine uses, so the step loop needs no tensors and a lab can swap any piece.
"""

from __future__ import annotations

from labkit.speculative.config import SpeculativeConfig


class NgramProposer:
    """Prompt lookup over the request's prompt and output so far (vLLM's "ngram" method); no model runs."""

    def __init__(self, config: SpeculativeConfig):
        self.config = config
        self.num_speculative_tokens = config.k

    def propose(self, request, k: int) -> tuple[list[int], object]:
        config = self.config
        draft = config.propose(request.all_token_ids, k, config.prompt_lookup_min, config.prompt_lookup_max)
        if not isinstance(draft, (list, tuple)) or not all(isinstance(t, int) for t in draft):
            raise TypeError(f"propose must return a list of token ids (ints), got {draft!r}")
        if len(draft) > k:
            raise ValueError(f"propose returned {len(draft)} tokens but was asked for at most k={k}")
        return list(draft), None

    def rollback(self, request, num_rejected: int, blocks) -> None:
        self.config.rollback(request, num_rejected, blocks)


class DraftModelProposer(NgramProposer):
    """A smaller model of the same vocabulary drafts ``k`` tokens, one at a time (vLLM's "draft_model" method).

    The simplest correct way: each proposal re-runs the request's whole context on the draft model's own cache, so
    it keeps no KV between steps and rollback concerns only the target's. Sampling requests get tokens sampled from
    the draft's filtered distribution q, returned with q for :func:`labkit.speculative.accept_sampling`.
    """

    def __init__(self, config: SpeculativeConfig, draft, target):
        super().__init__(config)
        check_same_vocabulary(draft, target)
        self.draft = draft

    def propose(self, request, k: int) -> tuple[list[int], object]:
        import torch

        from labkit.sampling import filtered_probabilities

        params = request.params
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.draft.device)
            seed = params.seed if params.seed is not None else torch.seed()
            generator.manual_seed((seed * 1_000_003 + request.num_tokens) % 2**63)
        with torch.inference_mode():
            logits, cache = self.draft.prefill(request.all_token_ids)
            row = logits[-1]
            draft, probs = [], []
            for i in range(k):
                if params.greedy:
                    token = int(row.argmax())
                else:
                    q = filtered_probabilities(row, params)
                    token = int(torch.multinomial(q, 1, generator=generator)[0])
                    probs.append(q)
                draft.append(token)
                if i + 1 < k:
                    row = self.draft.decode(token, cache)
        return draft, (torch.stack(probs) if probs else None)


def check_same_vocabulary(draft, target) -> None:
    """A draft model must speak the target's vocabulary: the same token ids must mean the same tokens."""
    draft_cfg, target_cfg = draft.config, target.config
    fix = "pick a draft model of the target's family (the same tokenizer), or use method 'ngram'"
    if draft_cfg.vocab_size != target_cfg.vocab_size:
        raise ValueError(
            f"draft model {draft_cfg.name!r} has a vocabulary of {draft_cfg.vocab_size} tokens but the target "
            f"{target_cfg.name!r} has {target_cfg.vocab_size}; {fix}"
        )
    draft_tok, target_tok = getattr(draft, "tokenizer", None), getattr(target, "tokenizer", None)
    if (draft_tok is None) != (target_tok is None):
        raise ValueError(
            f"only one of draft {draft_cfg.name!r} and target {target_cfg.name!r} has a tokenizer, so their "
            f"vocabularies cannot be shown to match; {fix}"
        )
    if draft_tok is not None and target_tok is not None and draft_tok.get_vocab() != target_tok.get_vocab():
        raise ValueError(
            f"draft model {draft_cfg.name!r} and target {target_cfg.name!r} have different tokenizers "
            f"(the same ids name different tokens); {fix}"
        )
