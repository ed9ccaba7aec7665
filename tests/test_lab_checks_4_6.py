"""The checks of labs 4-6: the solved answers pass, typical wrong answers fail with the right message.

The answers are the solution cells of the lab sources themselves (so the tests cannot drift
from the notebooks), and each wrong answer is that solution with one typical mistake edited in.
"""

import pytest
from lab_sources import solved

from labkit.grading import evaluate
from labkit.grading.result import FAIL, NOT_DONE, PASS


def answer(exercise_id: str, name: str, edits: tuple[tuple[str, str], ...] = ()):
    """The solved function (or class) ``name``, with each (old, new) edit applied to its source first."""
    return solved(exercise_id.split(".")[0], name, edits)


def verdict(exercise_id: str, name: str, *edits: tuple[str, str]):
    return evaluate(exercise_id, answer(exercise_id, name, edits))


CASES = [
    # (exercise, learner name, edits, expected status, words the message must contain)
    ("lab4.continuous_schedule", "continuous_schedule", (), PASS, "PASS"),
    (
        "lab4.continuous_schedule",
        "continuous_schedule",
        (("while state.waiting and len(state.running) < state.max_num_seqs:", "while state.waiting:"),),
        FAIL,
        "but max_num_seqs is 4",
    ),
    (
        "lab4.continuous_schedule",
        "continuous_schedule",
        (("    if output.preempted:\n", "    if output.preempted or state.running:\n"),),
        FAIL,
        "slots were in use while",
    ),
    (
        "lab4.continuous_schedule",
        "continuous_schedule",
        (("if num_new > budget or not state.blocks.can_allocate(head.request_id, num_new):", "if num_new > budget:"),),
        FAIL,
        "your function continuous_schedule raised OutOfBlocksError",
    ),
    ("lab4.ten_replies", "continuous_schedule", (), PASS, "PASS"),
    (
        "lab4.ten_replies",
        "continuous_schedule",
        (("    if output.preempted:\n", "    if output.preempted or state.running:\n"),),
        FAIL,
        "static batching takes 84",
    ),
    ("lab4.preemption", "choose_victim", (), PASS, "PASS"),
    (
        "lab4.preemption",
        "choose_victim",
        (("return state.running[-1]", "return state.running[0]"),),
        FAIL,
        "you preempted the oldest running request",
    ),
    (
        "lab4.preemption",
        "choose_victim",
        (("return state.running[-1]", "return request"),),
        FAIL,
        "the request being scheduled itself, while the newer",
    ),
    (
        "lab4.preemption",
        "choose_victim",
        (("return state.running[-1]", "return state.waiting[0] if state.waiting else None"),),
        FAIL,
        "which is not running",
    ),
    (  # the newest other than the asker: wrong only when the asker is itself the newest
        "lab4.preemption",
        "choose_victim",
        (
            (
                "return state.running[-1]",
                "others = [r for r in state.running if r is not request]\n    return others[-1] if others else request",
            ),
        ),
        FAIL,
        "is itself the newest running request, so it is the victim",
    ),
    ("lab4.serving_metrics", "serving_metrics", (), PASS, "PASS"),
    (
        "lab4.serving_metrics",
        "serving_metrics",
        (("/ (r.output_len - 1) * 1000", "/ r.output_len * 1000"),),
        FAIL,
        "TPOT included the first token",
    ),
    (
        "lab4.serving_metrics",
        "serving_metrics",
        (
            (
                "gaps = np.concatenate([np.diff(r.token_times) for r in records]) * 1000",
                "gaps = np.array([np.mean(np.diff(r.token_times)) for r in records]) * 1000",
            ),
        ),
        FAIL,
        "ITL was averaged per request",
    ),
    (
        "lab4.serving_metrics",
        "serving_metrics",
        (("all(m[name] <= limit", "any(m[name] <= limit"),),
        FAIL,
        "goodput counted requests that missed one SLO limit",
    ),
    (
        "lab4.serving_metrics",
        "serving_metrics",
        (("(r.first_token_time - r.arrival_time) * 1000", "(r.first_token_time - r.arrival_time)"),),
        FAIL,
        "seconds, not milliseconds",
    ),
    (
        "lab4.serving_metrics",
        "serving_metrics",
        (('[{"ttft": a, "tpot": b}', '[{"ttft": a / 1000, "tpot": b / 1000}'),),
        FAIL,
        "were seconds compared with limits in milliseconds",
    ),
    ("lab5.block_allocator", "PagedBlockAllocator", (), PASS, "PASS"),
    (
        "lab5.block_allocator",
        "PagedBlockAllocator",
        (("self.free_blocks.extend(self.tables.pop(seq_id, []))", "self.tables.pop(seq_id, [])"),),
        FAIL,
        " missing)",
    ),
    (
        "lab5.block_allocator",
        "PagedBlockAllocator",
        (("for _ in range(needed):", "for _ in range(math.ceil(num_tokens / self.block_size)):"),),
        FAIL,
        "blocks, expected",
    ),
    (
        "lab5.block_allocator",
        "PagedBlockAllocator",
        (("table.append(self.free_blocks.popleft())", "table.append(self.free_blocks[0])"),),
        FAIL,
        "owned by both",
    ),
    ("lab5.slot_mapping", "slot_mapping", (), PASS, "PASS"),
    ("lab5.slot_mapping", "slot_mapping", (("+ pos % block_size", "+ pos % block_size + 1"),), FAIL, "off by one"),
    (
        "lab5.slot_mapping",
        "slot_mapping",
        (("range(start, end)", "range(start, end + 1)"),),
        FAIL,
        "range(start, end) stops before end",
    ),
    (
        "lab5.slot_mapping",
        "slot_mapping",
        (("block_table[pos // block_size] * block_size + pos % block_size", "pos"),),
        FAIL,
        "positions themselves",
    ),
    ("lab5.paged_attention", "paged_attention", (), PASS, "PASS"),
    (
        "lab5.paged_attention",
        "paged_attention",
        (("torch.tensor(block_table,", "torch.tensor(sorted(block_table),"),),
        FAIL,
        "sorted order",
    ),
    (
        "lab5.paged_attention",
        "paged_attention",
        (("[:context_len]", ""), ("causal_mask(q.shape[0], context_len, q.device)", "None")),
        FAIL,
        "unused slots",
    ),
    (
        "lab5.paged_attention",
        "paged_attention",
        (("causal_mask(q.shape[0], context_len, q.device)", "None"),),
        FAIL,
        "not masked causally",
    ),
    ("lab5.paged_attention", "paged_attention", (("[:context_len]", ""),), FAIL, "cut keys and values to context_len"),
    ("lab6.chunked_schedule", "chunked_schedule", (), PASS, "PASS"),
    (
        "lab6.chunked_schedule",
        "chunked_schedule",
        (
            ("num_new = min(request.num_missing_tokens, budget)", "num_new = request.num_missing_tokens"),
            ("num_new = min(head.num_missing_tokens, budget)", "num_new = head.num_missing_tokens"),
        ),
        FAIL,
        "over the budget",
    ),
    (
        "lab6.chunked_schedule",
        "chunked_schedule",
        (("decoding + prompts", "prompts + decoding"),),
        FAIL,
        "were decoding but got no token",
    ),
    (
        "lab6.chunked_schedule",
        "chunked_schedule",
        (
            (
                "        if not state.blocks.can_allocate(head.request_id, num_new):",
                "        if num_new < head.num_missing_tokens or not state.blocks.can_allocate(head.request_id, num_new):",
            ),
        ),
        FAIL,
        "a chunk of its prompt had blocks and budget",
    ),
    ("lab6.choose_budget", "choose_budget", (), PASS, "PASS"),
    (
        "lab6.choose_budget",
        "choose_budget",
        (
            (
                "cost.pass_time(middle, context_tokens) * 1000 <= itl_ms",
                "cost.pass_time(middle, context_tokens) <= itl_ms",
            ),
        ),
        FAIL,
        "you compared seconds with milliseconds",
    ),
    (
        "lab6.choose_budget",
        "choose_budget",
        (("cost.pass_time(middle, context_tokens)", "cost.pass_time(middle, 0)"),),
        FAIL,
        "you left out the KV context the step reads",
    ),
    (
        "lab6.choose_budget",
        "choose_budget",
        (("    return low", "    return low + 1"),),
        FAIL,
        "breaks the promise",
    ),
    (
        "lab6.choose_budget",
        "choose_budget",
        (("    return low", "    return low - 1"),),
        FAIL,
        "which is larger",
    ),
    (  # never returns 0: the search starts at a budget of 1
        "lab6.choose_budget",
        "choose_budget",
        (("low, high = 0, 16_384", "low, high = 1, 16_384"),),
        FAIL,
        "so no budget keeps it: expected 0, got 1",
    ),
    (
        "lab6.choose_budget",
        "choose_budget",
        (("low, high = 0, 16_384", "low, high = 0, 16_383"),),
        FAIL,
        "stops one short of the top",
    ),
]


@pytest.mark.parametrize(
    "exercise_id, name, edits, status, words",
    [
        pytest.param(
            *case,
            marks=getattr(pytest.mark, case[0].split(".")[0]),
            id=f"{case[0]}-{'solved' if not case[2] else case[4][:24]}",
        )
        for case in CASES
    ],
)
def test_check_verdict(exercise_id, name, edits, status, words):
    result = verdict(exercise_id, name, *edits)
    assert result.status == status, result.message
    assert words in result.message


@pytest.mark.parametrize(
    "exercise_id, name, old, new, error",
    [
        pytest.param(
            "lab4.continuous_schedule",
            "continuous_schedule",
            "num_new = request.num_missing_tokens",
            "num_new = request.missing_tokens",
            "AttributeError",
            marks=pytest.mark.lab4,
        ),
        pytest.param(
            "lab6.chunked_schedule",
            "chunked_schedule",
            "num_new = min(request.num_missing_tokens, budget)",
            "num_new = min(request.missing_tokens, budget)",
            "AttributeError",
            marks=pytest.mark.lab6,
        ),
        pytest.param(
            "lab6.choose_budget",
            "choose_budget",
            "cost.pass_time(middle, context_tokens)",
            "cost.time(middle, context_tokens)",
            "AttributeError",
            marks=pytest.mark.lab6,
        ),
        pytest.param(
            "lab4.serving_metrics",
            "serving_metrics",
            "for r in records]) * 1000",
            "for r in records.values()]) * 1000",
            "AttributeError",
            marks=pytest.mark.lab4,
        ),
        pytest.param(
            "lab5.slot_mapping",
            "slot_mapping",
            "range(start, end)",
            "range(start, end + 1)",
            "IndexError",
            marks=pytest.mark.lab5,
        ),
        pytest.param(
            "lab5.paged_attention", "paged_attention", "[:context_len]", "", "RuntimeError", marks=pytest.mark.lab5
        ),
    ],
)
def test_an_exception_in_the_learners_code_names_their_function_and_line(exercise_id, name, old, new, error):
    result = verdict(exercise_id, name, (old, new))
    assert result.status == FAIL, result.message
    assert f"your function {name} raised {error}" in result.message
    assert "of your cell" in result.message and "Traceback" not in result.message


@pytest.mark.lab4
def test_unfinished_exercise_says_not_done():
    def continuous_schedule(state):
        raise NotImplementedError("Exercise lab4.continuous_schedule: replace this line with your code")

    result = evaluate("lab4.continuous_schedule", continuous_schedule)
    assert result.status == NOT_DONE and "NOT DONE" in result.message


@pytest.mark.lab6
def test_a_policy_that_schedules_nothing_fails_instead_of_hanging():
    from labkit.engine.scheduler import SchedulerOutput

    result = evaluate("lab6.chunked_schedule", lambda state: SchedulerOutput())
    assert result.status == FAIL and "slots were in use while" in result.message


@pytest.mark.lab4
@pytest.mark.parametrize("seed", range(8))
def test_the_preemption_check_pool_is_too_small_for_every_seed(seed):
    from labkit.engine.scheduler import newest
    from labkit.labs import lab4

    run = lab4.serve_choosing(lab4.preemption_requests(seed), newest)
    assert run["error"] is None and run["preemptions"] > 0
    assert all(choice["victim"] == choice["running"][-1] for choice in run["choices"])


@pytest.mark.lab4
def test_a_metrics_trace_tells_every_mistake_apart_from_the_right_answer():
    from labkit.labs import lab4

    for seed in range(50):
        inputs = lab4.metrics_inputs(seed)
        trace, slo = inputs["trace"], inputs["slo"]
        right = lab4.metrics_expected(trace, slo)
        for name, mistakes in lab4.metric_mistakes(trace, slo).items():
            for mistake, wrong in mistakes.items():
                assert abs(wrong - right[name]) > 1e-6 * abs(right[name]), (seed, name, mistake)


def chunks_verdict(*edits: tuple[str, str], schedule_edits: tuple[tuple[str, str], ...] = ()):
    """lab6.prefill_chunks with the solved (or edited) prediction and exercise 1's (or an edited) policy."""
    predict = answer("lab6.prefill_chunks", "prefill_chunks", edits)
    schedule = answer("lab6.chunked_schedule", "chunked_schedule", schedule_edits)
    return evaluate("lab6.prefill_chunks", predict, schedule)


@pytest.mark.lab6
@pytest.mark.parametrize(
    "edits, words",
    [
        ((), "PASS"),
        ((("room = budget - num_decoding", "room = budget"),), "decoding requests take one token each"),
        ((("([rest] if rest else [])", "([room] if rest else [])"),), "the last chunk is only what is left"),
        ((("([rest] if rest else [])", "[]"),), "the last, shorter chunk is missing"),
    ],
)
def test_prefill_chunks_names_the_mistake(edits, words):
    result = chunks_verdict(*edits)
    assert result.status == (PASS if not edits else FAIL), result.message
    assert words in result.message


@pytest.mark.lab6
def test_prefill_chunks_says_fix_exercise_1_first_when_the_policy_is_wrong():
    result = chunks_verdict(schedule_edits=(("decoding + prompts", "prompts + decoding"),))
    assert result.status == FAIL and "Fix exercise 1 first" in result.message


@pytest.mark.lab6
@pytest.mark.parametrize("seed", range(20))
def test_every_budget_case_tells_the_mistakes_apart(seed):
    from labkit.labs import lab6

    *seeded, none, top = lab6.budget_cases(seed)
    for case in seeded:
        right = lab6.largest_budget(case["cost"], case["itl_ms"], case["context_tokens"])
        assert 0 < right < lab6.MAX_BUDGET
        assert lab6.largest_budget(case["cost"], case["itl_ms"], 0) != right
        assert lab6.largest_budget(case["cost"], case["itl_ms"] * 1000, case["context_tokens"]) != right
    assert lab6.largest_budget(none["cost"], none["itl_ms"], none["context_tokens"]) == 0  # the range's two ends
    assert lab6.largest_budget(top["cost"], top["itl_ms"], top["context_tokens"]) == lab6.MAX_BUDGET
