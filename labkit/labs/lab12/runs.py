"""What parts 2 and 3 of lab 12 run with the learner's functions: the tier off and on, and a prefill engine handing
requests to a decode engine, against one engine doing both. Kept short (a few seconds on one thread): the point is
the pattern, which ``scripts/kv_tier_bench.py`` measures at more lengths."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

from labkit.bench.kv_tier import reload_against_recompute, returning_ttft
from labkit.engine import LLM
from labkit.kv.tier_policy import TierCosts
from labkit.labs.common.engine_runs import MAX_STEPS
from labkit.models.tokens import Prompt
from labkit.sampling import SamplingParams

ReloadDecision = Callable[[int, int, int, int, TierCosts], Sequence[int]]


def serve_handing_off(function, prefill: LLM, decode: LLM) -> dict[str, list[int]]:
    """Step both engines until neither has work, handing each request from ``prefill`` to ``decode`` through
    ``function`` (a ``hand_off_kv``) as soon as its first token is out. Returns the finished requests' tokens by id."""
    tokens: dict[str, list[int]] = {}
    for _ in range(MAX_STEPS):
        if not (prefill.has_unfinished() or decode.has_unfinished()):
            return tokens
        for engine in (prefill, decode):
            if engine.has_unfinished():
                tokens.update((out.request_id, out.token_ids) for out in engine.step() if out.finished)
        for ready in prefill.core.ready_to_hand_over():
            request, table = prefill.core.hand_over(ready.request_id)
            source, target = prefill.runner.cache, decode.runner.cache
            function(
                source.k, source.v, table, request.num_computed_tokens, decode.state.blocks, target.k, target.v,
                request.request_id,
            )  # fmt: skip
            decode.core.adopt(request)  # its blocks are the ones the hand-off allocated: allocate() finds them
    raise RuntimeError(f"the two engines passed {MAX_STEPS} steps without finishing every request")


def measure_tier_costs(model, prefix_tokens: int = 128) -> TierCosts:
    """Reload against recompute at one block and at ``prefix_tokens`` on this machine, printed; the costs fitted."""
    rows, costs, bytes_per_block = reload_against_recompute(model, [16, prefix_tokens], repeats=1)
    print(f"one block of 16 tokens: {bytes_per_block:,} bytes of K and V (every layer)")
    print(f"{'tokens':>7} {'reload from host ms':>20} {'compute again ms':>17}")
    for row in rows:
        print(f"{row['tokens']:>7} {row['host_s'] * 1e3:>20.2f} {row['recompute_s'] * 1e3:>17.1f}")
    print(
        f"fitted through the two reloads: a reload costs {costs.reload_fixed_seconds * 1e3:.2f} ms + "
        f"{costs.reload_seconds_per_block * 1e3:.2f} ms per block; a token costs "
        f"{costs.recompute_seconds_per_token * 1e3:.2f} ms to compute (the {prefix_tokens}-token prefill over its tokens)"
    )
    if costs.reload_fixed_seconds == 0:
        print(
            "(one block reloaded in less than the per-block cost between the two: the line through them would cost "
            "less than nothing at zero blocks, so the fixed cost is taken as 0)"
        )
    return costs


def tier_off_and_on(
    model, reload_or_recompute: ReloadDecision, costs: TierCosts, conversations: int = 2, prefix_tokens: int = 128
) -> dict[str, tuple[list[float], int]]:
    """``conversations`` chats on a pool that holds one at a time, then each returns with a new question: with no
    tier, and with a tier whose reloads ``reload_or_recompute`` decides on ``costs``. Printed, and returned as
    {"off"/"on": (TTFT of each returning turn in seconds, prompt tokens computed)}."""

    def policy(prompt_tokens: int, cached_tokens: int, tier_blocks: int, block_size: int) -> Sequence[int]:
        return reload_or_recompute(prompt_tokens, cached_tokens, tier_blocks, block_size, costs)

    runs = {
        "off": returning_ttft(model, conversations, prefix_tokens, tier_on=False),
        "on": returning_ttft(model, conversations, prefix_tokens, tier_on=True, reload_policy=policy),
    }
    print(f"{conversations} conversations of {prefix_tokens} tokens return, each after the pool evicted it")
    for name, (ttfts, computed) in runs.items():
        print(
            f"tier {name:>3}: prompt tokens computed {computed:>5,}, TTFT p50 {statistics.median(ttfts) * 1e3:6.1f} ms"
        )
    return runs


SPLIT_ENGINE = dict(block_size=16, max_num_seqs=4, enable_prefix_caching=False)


def apart_and_together(hand_off_kv, model, prompts: Sequence[Prompt], max_tokens: int = 8) -> list[bool]:
    """``prompts`` prefilled on one engine and decoded on another through ``hand_off_kv``, then on one engine alone;
    each answer printed, and whether the two gave the same tokens."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    prefill, decode = LLM(model, num_blocks=32, **SPLIT_ENGINE), LLM(model, num_blocks=64, **SPLIT_ENGINE)
    for index, prompt in enumerate(prompts):
        prefill.add_request(prompt, params, request_id=str(index))
    apart = serve_handing_off(hand_off_kv, prefill, decode)
    together = LLM(model, **SPLIT_ENGINE).generate(list(prompts), params, use_tqdm=False)
    same = []
    for index, (prompt, alone) in enumerate(zip(prompts, together)):
        split = apart.get(str(index), [])
        same.append(split == alone.token_ids)
        answer = model.tokenizer.decode(split) if model.tokenizer is not None else split
        print(f"{'same' if same[-1] else 'DIFFERENT'}  {prompt!r} ->{answer!r}")
    return same
