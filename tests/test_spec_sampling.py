"""Speculative sampling keeps the target's distribution: token frequencies over many seeds, speculation on vs off.

A tiny model with a 16-token vocabulary; the exact distribution of each output position is computed by
enumerating every earlier choice. Each request answers 4 tokens: the first is sampled plainly (a prompt
is never speculated), the second and third are the first two that go through verification (k = 2), so
their frequencies over thousands of seeds must match the exact marginals within a total-variation bound
that sampling noise alone respects. A rule that always accepts the draft must fail the same bound.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from labkit.engine import LLM
from labkit.models import tiny_model
from labkit.sampling import SamplingParams, filtered_probabilities
from labkit.speculative import accept_sampling

VOCAB = 16
PROMPT = [3, 4, 5, 3, 4, 5, 3, 4]  # repeats itself, so prompt lookup always has a draft
NUM_SEEDS = 3000
TEMPERATURE = 1.5
TV_BOUND = 0.05  # sampling noise alone: about 0.5 * sum sqrt(p (1 - p) / N) * 0.8 < 0.03 here


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0, vocab_size=VOCAB)


@pytest.fixture(scope="module")
def exact(model):
    """The exact marginal distribution of output tokens 1, 2 and 3, by enumerating earlier choices."""
    params = SamplingParams(temperature=TEMPERATURE)

    def next_probs(tokens):
        logits, _ = model.prefill(PROMPT + list(tokens))
        return filtered_probabilities(logits[-1], params).double()

    with torch.inference_mode():
        first = next_probs([])
        second, third = torch.zeros(VOCAB, dtype=torch.double), torch.zeros(VOCAB, dtype=torch.double)
        for a in range(VOCAB):
            after_a = next_probs([a])
            second += first[a] * after_a
            for b in range(VOCAB):
                third += first[a] * after_a[b] * next_probs([a, b])
    return [first, second, third]


class DraftKeepingRows:
    """The draft model with its next-token logits kept per context, for the proposer to call as it calls a model.

    The proposer re-runs each request's whole context on the draft model, and 3,000 requests of one prompt and a
    16-token vocabulary ask a few hundred contexts over and over; each is run once here. The draft's distribution q is
    still one function of the context, sampled from and handed to verification as the proposer does with any model.
    """

    def __init__(self, model):
        self.model, self.config, self.device, self.tokenizer = model, model.config, model.device, model.tokenizer
        self.rows: dict[tuple[int, ...], torch.Tensor] = {}

    def row(self, context: list[int]) -> torch.Tensor:
        key = tuple(context)
        if key not in self.rows:
            self.rows[key] = self.model.prefill(context)[0][-1]
        return self.rows[key]

    def prefill(self, token_ids: list[int]) -> tuple[torch.Tensor, list[int]]:
        context = list(token_ids)  # the "cache" is the context itself
        return self.row(context)[None], context

    def decode(self, token_id: int, context: list[int]) -> torch.Tensor:
        context.append(token_id)
        return self.row(context)


def frequencies(model, speculative_config) -> list[torch.Tensor]:
    llm = LLM(model, num_blocks=2048, block_size=4, max_num_seqs=256, speculative_config=speculative_config)
    params = [SamplingParams(max_tokens=4, temperature=TEMPERATURE, seed=s, ignore_eos=True) for s in range(NUM_SEEDS)]
    outputs = llm.generate([PROMPT] * NUM_SEEDS, params, use_tqdm=False)
    if speculative_config is not None:
        assert sum(step.num_draft_tokens for step in llm.trace.steps) > 0
    counts = torch.zeros(3, VOCAB, dtype=torch.double)
    for output in outputs:
        for position in range(3):
            counts[position, output.token_ids[position]] += 1
    return list(counts / NUM_SEEDS)


def total_variation(p, q) -> float:
    return 0.5 * float((p - q).abs().sum())


def test_sampling_without_speculation_matches_the_exact_distribution(model, exact):
    for position, freq in enumerate(frequencies(model, None)):
        assert total_variation(freq, exact[position]) < TV_BOUND, f"token {position + 1}"


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_speculative_sampling_keeps_the_target_distribution(model, exact, method):
    config = {"method": method, "num_speculative_tokens": 2}
    if method == "draft_model":
        draft = DraftKeepingRows(tiny_model("llama", seed=5, vocab_size=VOCAB, num_hidden_layers=1))
        config["model"] = draft
    for position, freq in enumerate(frequencies(model, config)):
        distance = total_variation(freq, exact[position])
        assert distance < TV_BOUND, f"token {position + 1}: total variation {distance:.3f} from the target's"
    if method == "draft_model":
        assert len(draft.rows) > VOCAB  # the proposer asked the draft after the prompt's own token and its drafts


def test_the_bound_catches_a_rule_that_always_accepts_the_draft(model, exact):
    def always_accept(draft, draft_probs, target_probs, generator=None):
        return list(draft) + [int(torch.multinomial(target_probs[len(draft)], 1, generator=generator)[0])]

    config = {"method": "ngram", "num_speculative_tokens": 2, "accept_sampling": always_accept}
    distances = [total_variation(f, e) for f, e in zip(frequencies(model, config), exact)]
    assert distances[0] < TV_BOUND  # the first token is never speculated
    assert max(distances[1:]) > TV_BOUND, distances


def test_accept_sampling_draws_are_reproducible_with_a_seeded_generator():
    p = torch.softmax(torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)), dim=-1)
    q = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(1)), dim=-1)
    runs = [
        [accept_sampling([1, 2], q, p, g) for _ in range(20)]
        for g in (torch.Generator().manual_seed(9), torch.Generator().manual_seed(9))
    ]
    assert runs[0] == runs[1]
    assert len({len(r) for r in itertools.chain(*runs)}) > 1  # some draws accept more than others
