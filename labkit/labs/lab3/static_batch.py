"""Lab 3, exercise 3: a static batch decoded until its longest member ends, each row against its solo run."""

from __future__ import annotations

from typing import Any

from labkit.engine.reference import SoloRun, solo_greedy
from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tokens
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import check_logits, check_positions, diagnosed
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import course_model, ends_early_prompt, pick_prompts, rng
from labkit.labs.hints import register_hints
from labkit.labs.lab3.left_pad import LEFT_PAD, padded_layout
from labkit.labs.lab3.mask import MASK, course_padded_causal_mask


def _batch_inputs(seed: int) -> tuple[Any, list[list[int]], list[int], int]:
    """Four prompts of different lengths: a short one (so the batch surely pads), one asked for no tokens,
    the longest asked for more than its reply holds before end-of-text (ignored here), and one more."""
    pick = rng(seed)
    short, zero, other = pick_prompts(seed, 3)
    prompts = [short[:3], zero, ends_early_prompt(), other]
    max_new = [pick.randint(1, 3), 0, 5, pick.randint(2, 4)]
    return course_model(), prompts, max_new, 2


def _run_batch(functions, inputs) -> dict[str, Any]:
    model, prompts, max_new, pad_id = inputs
    recording = RecordingModel(model, record_layers=0)
    outputs = functions[0](recording, [list(p) for p in prompts], list(max_new), pad_id)
    rows, step_logits = len(prompts), []
    for index, call in enumerate(recording.calls):
        logits = call["logits"]
        if index == 0 and logits.shape[0] != rows and logits.shape[0] % rows == 0:
            logits = logits[logits.shape[0] // rows - 1 :: logits.shape[0] // rows]  # each row's last column
        step_logits.append(logits)
    return {
        "outputs": outputs,
        "logits": step_logits,
        "calls": [{k: call[k] for k in ("input_ids", "positions")} for call in recording.calls],
    }


def _solo(model, prompt: list[int], max_new: int) -> SoloRun:
    """The prompt decoded alone for exactly ``max_new`` tokens, end-of-text ignored (none for 0)."""
    run = solo_greedy(model, prompt, max(max_new, 1), ignore_eos=True)
    return SoloRun(run.tokens[:max_new], run.logits[:max_new], run.gaps[:max_new])


def _batch_oracle(inputs) -> dict[str, Any]:
    model, prompts, max_new, _ = inputs
    solo = [_solo(model, p, n) for p, n in zip(prompts, max_new)]
    return {
        "outputs": [run.tokens for run in solo],
        "logits": [[logit.cpu() for logit in run.logits] for run in solo],
        "prompts": [list(p) for p in prompts],
        "max_new": list(max_new),
        "eos": model.tokenizer.eos_token_id,
    }


def _compare_layout(prompts: list[list[int]], calls: list[dict]) -> Mismatch | None:
    rows = len(prompts)
    if not calls:
        return Mismatch("model.forward was never called", "Prefill the padded batch in one pass, then decode.")
    ids, positions = calls[0]["input_ids"], calls[0]["positions"]
    if ids.numel() % rows:
        return Mismatch(
            f"the first pass holds {ids.numel()} tokens, not a multiple of the {rows} rows",
            "Prefill the whole padded rectangle [B, L], flattened row by row (ids.flatten()).",
        )
    width = ids.numel() // rows
    ids, positions = ids.view(rows, width), positions.view(rows, width)
    for row, prompt in enumerate(prompts):
        n = len(prompt)
        if ids[row, width - n :].tolist() != prompt:
            if ids[row, :n].tolist() == prompt and n < width:
                return Mismatch(
                    f"row {row} of the first pass starts with its prompt and ends with pads (right padding)",
                    "Pad on the LEFT: the last column must be every row's last real token, since the "
                    "next token is read from there and each decode step appends one column.",
                )
            return Mismatch(
                f"row {row} of the first pass is {ids[row].tolist()}; it should end with prompt {row}",
                "Build the batch with your left_pad and flatten it row by row.",
            )
        mismatch = check_positions(positions[row, width - n :], list(range(n)), f"the prefill pass, row {row}")
        if mismatch:
            return mismatch
    return None


def _compare_decode_passes(prompts: list[list[int]], steps: int, decodes: list[dict]) -> Mismatch | None:
    """The decode passes: as many as the longest request needs, one token per row, each row at its own position."""
    if len(decodes) != steps - 1:
        return Mismatch(
            f"the batch made {len(decodes)} decode passes; its longest member needs {steps} tokens, so "
            f"{steps - 1} decode passes after the prefill",
            "A static batch runs until its LONGEST member ends."
            if len(decodes) < steps - 1
            else "The prefill's logits give every row's first token and each decode pass one more, so the pass "
            "after the longest request's last token is wasted: stop before it.",
        )
    width = max(map(len, prompts))
    for step, call in enumerate(decodes, start=1):
        if call["input_ids"].numel() != len(prompts):
            return Mismatch(
                f"decode pass {step} fed {call['input_ids'].numel()} tokens for {len(prompts)} rows",
                "In a static batch every row stays in the batch, finished or not: one token per row per step.",
            )
        expected_positions = [len(p) + step - 1 for p in prompts]
        mismatch = check_positions(call["positions"], expected_positions, f"decode pass {step}")
        if mismatch and call["positions"].tolist() == [width + step - 1] * len(prompts):
            return Mismatch(
                mismatch.difference,
                "Every row got the padded width as its position. A position counts the row's own tokens, pads "
                "excluded: row b's next position is len(prompts[b]), then one more per step.",
            )
        if mismatch:
            return mismatch
    return None


def _compare_batch(expected, got) -> Mismatch | None:
    prompts, max_new, calls = expected["prompts"], expected["max_new"], got["calls"]
    return (
        _compare_layout(prompts, calls)
        or _compare_decode_passes(prompts, max(max_new), calls[1:])
        or _outputs_problem(prompts, got["outputs"])
        or _first_row_problem(expected, got)
    )


def _outputs_problem(prompts: list[list[int]], outputs: Any) -> Mismatch | None:
    if not isinstance(outputs, list) or len(outputs) != len(prompts):
        return Mismatch(f"expected a list of {len(prompts)} token lists, one per prompt, got {type(outputs).__name__}")
    return None


def _first_row_problem(expected, got) -> Mismatch | None:
    """The first sequence that parts from its solo run, with the hint its kind of mistake calls for."""
    prompts, max_new = expected["prompts"], expected["max_new"]
    failures = {row: problem for row in range(len(prompts)) if (problem := _row_problem(row, expected, got))}
    if not failures:
        return None
    row, mismatch = next(iter(failures.items()))
    label = f"sequence {row} (prompt of {len(prompts[row])} tokens, {max_new[row]} new) against its solo run"
    hint = _row_hint(expected, got["outputs"][row], row, list(failures))
    return (Mismatch(mismatch.difference, hint) if hint else mismatch).within(label)


def _row_hint(expected, mine: Any, row: int, failures: list[int]) -> str | None:
    """What a wrong row shows: tokens kept past max_new_tokens, a stop at end-of-text, or pads that leak (only
    the padded rows wrong)."""
    prompts, want = expected["prompts"], expected["outputs"][row]
    if isinstance(mine, list) and len(mine) > expected["max_new"][row]:
        return (
            "Keep only each sequence's first max_new_tokens[b] tokens (none when it is 0): what a "
            "finished row produces afterwards is padding work."
        )
    if isinstance(mine, list) and mine and mine[-1] == expected["eos"] and mine == want[: len(mine)]:
        return (
            "This row stopped at end-of-text. Ignore it here: every row gets exactly max_new_tokens[b] "
            "tokens (the next lab's scheduler lets a request finish early)."
        )
    padded = [len(p) < max(map(len, prompts)) for p in prompts]
    if all(padded[r] for r in failures) and not any(padded[r] for r in range(len(prompts)) if r not in failures):
        return "Only the padded rows differ: pads leak into attention. The mask must hide every key that is a pad."
    return None


def _row_problem(row: int, expected, got) -> Mismatch | None:
    """The first step where this row's logits or tokens part from its solo run."""
    for step, want in enumerate(expected["logits"][row]):
        if step < len(got["logits"]) and got["logits"][step].dim() == 2 and row < got["logits"][step].shape[0]:
            mismatch = check_logits(want, got["logits"][step][row], "logits")
            if mismatch:
                return mismatch.within(f"step {step}")
    return compare_tokens(expected["outputs"][row], got["outputs"][row])


STATIC_BATCH = diagnosed(
    Exercise(
        id="lab3.generate_static_batch",
        functions=("generate_static_batch",),
        make_inputs=_batch_inputs,
        run=_run_batch,
        oracle=_batch_oracle,
        compare=_compare_batch,
        tested="generate_static_batch(model, prompts, max_new_tokens, pad_id) on 4 prompts of different lengths with the "
        "default model, on the course's own left_pad and mask (yours are checked on their own), one row asked for "
        "no tokens and one for more than its reply holds before end-of-text: left-padded prefill, one token per "
        "row per step until the longest ends (no pass after it), and every sequence equal to its solo greedy run",
        hint="Prefill the padded rectangle once, reading each row's last column; then each step adds one real column "
        "for every row, at the position that counts that row's tokens so far, until the longest request ends. "
        'labkit.hint("lab3.generate_static_batch") shows more.',
    )
)
register(on_its_own(STATIC_BATCH, Piece(LEFT_PAD, padded_layout), Piece(MASK, course_padded_causal_mask)))

register_hints(
    "lab3.generate_static_batch",
    "One prefill pass over the padded rectangle, then one pass per step in which every row adds one token. The "
    "batch runs until the longest request is done; a row that finished early keeps decoding, but its extra tokens "
    "are not kept.",
    "left_pad the prompts; make a PaddedBatchCache for the model's layers and the B rows; add the prompt's columns "
    "(is_real) and prefill the flattened rectangle, asking only for each row's last column. Then repeat: argmax "
    "per row, keep the token if that row still wants more, stop after the longest request's last token; else add "
    "one real column for every row and run the B tokens at each row's next position (its prompt length, then +1 "
    "per step).",
    "cache = PaddedBatchCache(model.config.num_layers, B, padded_causal_mask); cache.add_columns(is_real); "
    "logits = model.forward(ids.flatten(), positions.flatten(), cache.attend, torch.arange(B) * L + L - 1) "
    "(everything on model.device); each step: tokens = logits.argmax(dim=-1); "
    "cache.add_columns(torch.ones(B, 1, dtype=torch.bool)); logits = model.forward(tokens, next_positions, "
    "cache.attend).",
)
