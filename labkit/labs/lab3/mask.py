"""Lab 3, exercise 2: the mask of a padded batch, hiding pads and the future at once; a wrong mask is named by the
typical mistake it shows."""

from __future__ import annotations

import torch

from labkit.grading.checks import Exercise, register
from labkit.grading.compare import compare_tensors
from labkit.grading.result import Mismatch
from labkit.kv.attention import causal_mask
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.common.shared import on_check_device, rng
from labkit.labs.hints import register_hints
from labkit.labs.lab3.left_pad import padded_layout


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
        swapped = right[-1].transpose(1, 2)
        pads_visible = causal[None].expand_as(real)
        first_keys = torch.tril(torch.ones(num_queries, num_keys, dtype=torch.bool, device=is_real.device))[None] & real
        known = {
            "Queries and keys are swapped: the mask is [B, Tq, Tk], the query axis before the key axis.": swapped,
            "Pads are visible: a key is allowed only if it is a real token (and not in the future).": pads_visible,
            "Not causal: queries see keys after them. Combine the padding mask with a causal mask.": real,
            "The causal part is aligned to the first keys; the queries are the LAST num_queries tokens, so query i "
            "sits at column num_keys - num_queries + i.": first_keys,
        }
        mistakes.append(known)
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

register_hints(
    "lab3.padded_causal_mask",
    "Two rules must both hold: the key is a real token of this row, and it is not after the query. The first "
    "depends on the row and the key; the second on the query and the key, the same for every row.",
    "Make the causal [num_queries, Tk] mask for the last num_queries of Tk columns, on key_is_real's device; give "
    "it a row axis and give key_is_real a query axis, so that both broadcast to [B, num_queries, Tk]; combine them "
    "with a logical and.",
    "causal_mask(num_queries, key_is_real.shape[1], key_is_real.device)[None, :, :] & key_is_real[:, None, :].",
)
