"""Lab 3, static batching: the checks for its four exercises.

The learner lays prompts of different lengths out as one rectangle (left padding, positions
counted from each prompt's first real token), writes the mask that hides pads and the future,
decodes the whole batch until its longest member ends, and counts the slot-steps lost to
padding. The oracle for the batch is each prompt decoded alone, greedily, with labkit's cache.
The batch is graded on the course's own left_pad and mask (``on_its_own``), so one mistake costs
one point; the learner's own are checked on the side.
"""

from __future__ import annotations

from typing import Any

import torch

from labkit.engine.reference import SoloRun, solo_greedy
from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors, compare_tokens
from labkit.grading.result import Mismatch
from labkit.kv.attention import causal_mask
from labkit.labs.common.diagnose import check_logits, check_positions, diagnosed
from labkit.labs.common.pieces import Piece, on_its_own
from labkit.labs.common.recording import RecordingModel
from labkit.labs.common.shared import course_model, ends_early_prompt, on_check_device, pick_prompts, rng
from labkit.labs.hints import register_hints
from labkit.viz.timeline import batch_spans
from labkit.workloads import LogNormal

# --- lab3.left_pad ------------------------------------------------------------------------


def _pad_inputs(seed: int) -> tuple[list[list[int]], int]:
    """Four prompts of four different lengths, and a pad id that is never 0 (nor any real token's id)."""
    pick = rng(seed)
    lengths = [3, 1, 5] + [pick.choice((2, 4, 6))]
    prompts = [[pick.randint(10, 999) for _ in range(n)] for n in lengths]
    return prompts, pick.randint(2, 9)


def padded_layout(prompts: list[list[int]], pad_id: int, left: bool = True) -> tuple[torch.Tensor, ...]:
    """ids, is_real and positions [B, L] of a padded batch (pads at position 0); left or right padding."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    is_real = torch.zeros(len(prompts), width, dtype=torch.bool)
    positions = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        columns = slice(width - len(prompt), width) if left else slice(0, len(prompt))
        ids[row, columns] = torch.tensor(prompt)
        is_real[row, columns] = True
        positions[row, columns] = torch.arange(len(prompt))
    return ids, is_real, positions


def _pad_oracle(inputs) -> dict[str, Any]:
    prompts, pad_id = inputs
    return {"left": padded_layout(prompts, pad_id), "right": padded_layout(prompts, pad_id, left=False)}


def _compare_pad(expected, got) -> Mismatch | None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        return Mismatch(
            f"left_pad returned {type(got).__name__}, expected a tuple (ids, is_real, positions)",
            "Return three [B, L] tensors: token ids, a bool mask of real tokens, and positions.",
        )
    (ids, is_real, positions), right = expected["left"], expected["right"]
    got_ids, got_real, got_positions = got
    if isinstance(got_ids, torch.Tensor) and got_ids.shape == ids.shape and torch.equal(got_ids, right[0]):
        return Mismatch(
            "the pads are at the end of each row (right padding)",
            "Pad on the LEFT: then every row's last column holds its last real token, and the next "
            "token of every sequence is predicted from the same column.",
        )
    if isinstance(got_real, torch.Tensor) and got_real.shape == is_real.shape and got_real.dtype != torch.bool:
        return Mismatch(
            f"is_real has dtype {got_real.dtype}, expected torch.bool",
            "is_real is a mask, not a count: make it bool (torch.zeros(B, L, dtype=torch.bool)), so that it can "
            "index and combine with & and ~ as a mask does.",
        )
    for name, want, have, dims in (
        ("ids", ids, got_ids, ("row", "column")),
        ("is_real", is_real, got_real, ("row", "column")),
    ):
        mismatch = compare_tensors(want, have, dims=dims, what=name)
        if mismatch:
            return mismatch
    if not isinstance(got_positions, torch.Tensor) or got_positions.shape != positions.shape:
        return compare_tensors(positions, got_positions, dims=("row", "column"), what="positions")
    counted_from_row_start = torch.arange(ids.shape[1]).expand_as(ids)
    real_positions = got_positions.where(is_real, torch.zeros_like(got_positions))
    if not torch.equal(real_positions, positions) and torch.equal(
        got_positions.where(is_real, counted_from_row_start), counted_from_row_start
    ):
        return Mismatch(
            "positions count from the start of the row, pads included",
            "A token's position is its index in its own prompt: the first real token is at 0, "
            "however many pads come before it.",
        )
    mismatch = compare_tensors(positions, real_positions, dims=("row", "column"), what="position of a real token")
    return mismatch


LEFT_PAD = register(
    diagnosed(
        Exercise(
            id="lab3.left_pad",
            functions=("left_pad",),
            answers=("labkit.labs.lab3.padded_layout",),
            make_inputs=_pad_inputs,
            run=lambda functions, inputs: functions[0](*inputs),
            oracle=_pad_oracle,
            compare=_compare_pad,
            tested="left_pad(prompts, pad_id) on 4 prompts of lengths 3, 1, 5 and one more, with a pad id other than "
            "0: ids, is_real (bool) and positions [B, L] (positions of pads are not checked)",
            hint="Rows are as wide as the longest prompt; a shorter prompt sits at the right end of its row, pads on the "
            'left; positions count from each prompt\'s first real token. labkit.hint("lab3.left_pad") shows more.',
        )
    )
)

# --- lab3.padded_causal_mask --------------------------------------------------------------


def _mask_inputs(seed: int) -> tuple[list[tuple[torch.Tensor, int]]]:
    pick = rng(seed)
    lengths = [5, 2, pick.choice((1, 3, 4))]
    _, prefill_real, _ = padded_layout([[1] * n for n in lengths], 0)
    decoded = torch.cat([prefill_real, torch.ones(3, 2, dtype=torch.bool)], dim=1)
    return on_check_device(([(prefill_real, 5), (decoded, 1), (decoded, 2)],))


def course_padded_causal_mask(key_is_real: torch.Tensor, num_queries: int) -> torch.Tensor:
    """The course's answer to exercise 2, used in place of the learner's when exercise 3 is graded."""
    return causal_mask(num_queries, key_is_real.shape[1], key_is_real.device)[None] & key_is_real[:, None, :]


def _mask_oracle(inputs) -> dict[str, list[torch.Tensor]]:
    right, mistakes = [], []
    for is_real, num_queries in inputs[0]:
        num_keys = is_real.shape[1]
        causal = causal_mask(num_queries, num_keys, is_real.device)
        real = is_real[:, None, :].expand(-1, num_queries, -1)
        right.append(causal[None] & real)
        mistakes.append(
            {
                "Queries and keys are swapped: the mask is [B, Tq, Tk], the query axis before the key axis.": right[
                    -1
                ].transpose(1, 2),
                "Pads are visible: a key is allowed only if it is a real token (and not in the future).": causal[
                    None
                ].expand_as(real),
                "Not causal: queries see keys after them. Combine the padding mask with a causal mask.": real,
                "The causal part is aligned to the first keys; the queries are the LAST num_queries tokens, so query i "
                "sits at column num_keys - num_queries + i.": torch.tril(
                    torch.ones(num_queries, num_keys, dtype=torch.bool, device=is_real.device)
                )[None]
                & real,
            }
        )
    return {"masks": right, "mistakes": mistakes}


def _compare_masks(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["masks"]):
        return Mismatch(f"expected {len(expected['masks'])} masks, got {type(got).__name__}")
    for index, (want, have, mistakes) in enumerate(zip(expected["masks"], got, expected["mistakes"])):
        mismatch = compare_tensors(want, have, dims=("row", "query", "key"), what="mask")
        if mismatch is None:
            continue
        label = f"case {index} ({want.shape[1]} queries over {want.shape[2]} keys)"
        for hint, wrong in mistakes.items():
            if isinstance(have, torch.Tensor) and have.shape == wrong.shape and torch.equal(have.bool(), wrong):
                return Mismatch(mismatch.difference, hint).within(label)
        return mismatch.within(label)
    return None


MASK = register(
    diagnosed(
        Exercise(
            id="lab3.padded_causal_mask",
            functions=("padded_causal_mask",),
            answers=("labkit.labs.lab3.course_padded_causal_mask",),
            make_inputs=_mask_inputs,
            run=lambda functions, inputs: [functions[0](is_real, n) for is_real, n in inputs[0]],
            oracle=_mask_oracle,
            compare=_compare_masks,
            tested="padded_causal_mask(key_is_real, num_queries) for a left-padded prefill (5 queries) and two decode "
            "passes (1 and 2 new columns): bool [B, Tq, Tk]",
            hint="A query sees a key when the key is real in its row and not after the query (the causal rule aligned to "
            'the last columns). labkit.hint("lab3.padded_causal_mask") shows more.',
        )
    )
)

# --- lab3.generate_static_batch -----------------------------------------------------------


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
    mismatch = _compare_layout(prompts, calls) or _compare_decode_passes(prompts, max(max_new), calls[1:])
    if mismatch:
        return mismatch
    outputs = got["outputs"]
    if not isinstance(outputs, list) or len(outputs) != len(prompts):
        return Mismatch(f"expected a list of {len(prompts)} token lists, one per prompt, got {type(outputs).__name__}")
    padded = [len(p) < max(map(len, prompts)) for p in prompts]
    problems = {row: _row_problem(row, expected, got) for row in range(len(prompts))}
    failures = [row for row, problem in problems.items() if problem]
    for row in failures:
        mismatch, mine, want = problems[row], outputs[row], expected["outputs"][row]
        label = f"sequence {row} (prompt of {len(prompts[row])} tokens, {max_new[row]} new) against its solo run"
        if isinstance(mine, list) and len(mine) > max_new[row]:
            return Mismatch(
                mismatch.difference,
                "Keep only each sequence's first max_new_tokens[b] tokens (none when it is 0): what a "
                "finished row produces afterwards is padding work.",
            ).within(label)
        eos = expected["eos"]
        if isinstance(mine, list) and mine and mine[-1] == eos and mine == want[: len(mine)]:
            return Mismatch(
                mismatch.difference,
                "This row stopped at end-of-text. Ignore it here: every row gets exactly max_new_tokens[b] "
                "tokens (the next lab's scheduler lets a request finish early).",
            ).within(label)
        if all(padded[r] for r in failures) and not any(padded[r] for r in range(len(prompts)) if r not in failures):
            return Mismatch(
                mismatch.difference,
                "Only the padded rows differ: pads leak into attention. The mask must hide every key that is a pad.",
            ).within(label)
        return mismatch.within(label)
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


# --- lab3.padding_waste -------------------------------------------------------------------


def _waste_inputs(seed: int) -> tuple[list[tuple[list[int], int]]]:
    skewed = LogNormal(median=20, sigma=1.2, high=500).sample(24, seed=seed % 2**32).tolist()
    return ([([10, 500], 2), ([3, 1, 4, 1, 5, 9, 2], 3), (skewed, 4)],)


def _waste(output_lens: list[int], batch_size: int) -> dict[str, float]:
    spans = batch_spans(output_lens, batch_size)
    useful, padded = sum(s[1] for s in spans), sum(s[2] for s in spans)
    return {"useful": useful, "padded": padded, "utilisation": useful / (useful + padded)}


def _waste_oracle(inputs) -> dict[str, Any]:
    cases = inputs[0]
    right = [_waste(lens, size) for lens, size in cases]
    global_max = []
    for lens, _ in cases:
        useful = sum(lens)
        total = max(lens) * len(lens)
        global_max.append({"useful": useful, "padded": total - useful, "utilisation": useful / total})
    return {"right": right, "global_max": global_max, "cases": [[list(lens), size] for lens, size in cases]}


def _compare_waste(expected, got) -> Mismatch | None:
    if not isinstance(got, list) or len(got) != len(expected["right"]):
        return Mismatch(f"expected one result per case ({len(expected['right'])}), got {type(got).__name__}")
    for (lens, size), want, wrong_max, have in zip(expected["cases"], expected["right"], expected["global_max"], got):
        where = f"output lengths {lens[:8]}{'...' if len(lens) > 8 else ''}, batch size {size}"
        if not isinstance(have, dict) or set(have) != {"useful", "padded", "utilisation"}:
            return Mismatch(
                f"{where}: got {have!r}", "Return a dict with the keys 'useful', 'padded' and 'utilisation'."
            )
        if (
            have["useful"] == want["useful"]
            and have["padded"] == want["padded"]
            and abs(have["utilisation"] - want["utilisation"]) < 1e-9
        ):
            continue
        detail = f"{where}: expected {want}, got {have}"
        if have["padded"] == wrong_max["padded"] and want["padded"] != wrong_max["padded"]:
            return Mismatch(
                detail, "Each batch runs until ITS OWN longest member ends, not the longest of the workload."
            )
        if have["useful"] == want["useful"] and have["padded"] == want["padded"]:
            return Mismatch(
                detail, "utilisation = useful / (useful + padded): the share of held slot-steps that produced a token."
            )
        if have["useful"] != want["useful"]:
            return Mismatch(detail, "Useful slot-steps are the tokens produced: the sum of the output lengths.")
        return Mismatch(
            detail,
            "A request holds its slot from its batch's first step to that batch's last; a batch "
            "of k requests holds k slots.",
        )
    return None


register(
    diagnosed(
        Exercise(
            id="lab3.padding_waste",
            functions=("padding_waste",),
            answers=("labkit.viz.timeline.batch_spans", "labkit.labs.lab3._waste"),
            make_inputs=_waste_inputs,
            run=lambda functions, inputs: [functions[0](list(lens), size) for lens, size in inputs[0]],
            oracle=_waste_oracle,
            compare=_compare_waste,
            tested="padding_waste(output_lens, batch_size) on a 10-token and a 500-token answer together, a short list with a "
            "partial last batch, and 24 skewed lengths",
            hint="A batch holds every slot until its longest request ends: a member's slot is useful for its own length "
            "and padded for the rest; utilisation is useful over all slot-steps held. "
            'labkit.hint("lab3.padding_waste") shows more.',
        )
    )
)


# --- hints, one tier per labkit.hint() call: the idea, the structure, then near-code -----

register_hints(
    "lab3.left_pad",
    "Every row is as wide as the longest prompt. A shorter prompt sits at the right end of its row, so that all "
    "rows end in the same column; the pads fill the left. Positions count from each prompt's own first token.",
    "Start from a [B, L] tensor full of pad_id, and [B, L] zeros for is_real (bool) and positions (long). For each "
    "row, fill its last len(prompt) columns: the prompt's ids, True, and 0 .. len(prompt)-1.",
    "torch.full((B, L), pad_id, dtype=torch.long); torch.zeros(B, L, dtype=torch.bool); for row b, start = L - "
    "len(prompt): ids[b, start:] = torch.tensor(prompt); is_real[b, start:] = True; "
    "positions[b, start:] = torch.arange(len(prompt)).",
)
register_hints(
    "lab3.padded_causal_mask",
    "Two rules must both hold: the key is a real token of this row, and it is not after the query. The first "
    "depends on the row and the key; the second on the query and the key, the same for every row.",
    "Make the causal [num_queries, Tk] mask for the last num_queries of Tk columns, on key_is_real's device; give "
    "it a row axis and give key_is_real a query axis, so that both broadcast to [B, num_queries, Tk]; combine them "
    "with a logical and.",
    "causal_mask(num_queries, key_is_real.shape[1], key_is_real.device)[None, :, :] & key_is_real[:, None, :].",
)
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
register_hints(
    "lab3.padding_waste",
    "A batch holds all its slots until its longest request finishes, so each member's slot is useful for its own "
    "length and padded for the rest of the batch's steps.",
    "Cut the lengths into consecutive groups of batch_size (the last may be smaller). A group runs as many steps as "
    "its longest member; useful is the sum of all lengths; padded adds, for every member, the group's steps minus "
    "its length; utilisation is useful / (useful + padded).",
    "for first in range(0, len(output_lens), batch_size): group = output_lens[first : first + batch_size]; "
    "padded += sum(max(group) - n for n in group).",
)
