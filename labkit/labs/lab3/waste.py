"""Lab 3, exercise 4: the slot-steps a static batch loses to padding, from the output lengths alone."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.grading.result import Mismatch
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.hints import register_hints
from labkit.viz.timeline import batch_spans
from labkit.workloads import LogNormal


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
    global_max = [_waste(lens, len(lens)) for lens, _ in cases]  # the whole workload as one batch
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
