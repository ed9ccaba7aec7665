"""Lab 11, exercise 2: ``split_kv_kernel`` and ``merge_splits_kernel``, split-KV ("flash-decoding"), checked under
Triton's interpreter on seeded cases (:mod:`~labkit.labs.lab11.kernel_cases`)."""

from __future__ import annotations

from typing import Any

from labkit.grading.checks import Exercise, register
from labkit.labs.common.diagnose import diagnosed
from labkit.labs.hints import register_hints
from labkit.labs.lab11.compiled import kernel_rule
from labkit.labs.lab11.kernel_cases import TENSORS, compare_cases, expected_outputs, split_cases


def _run_split(functions, inputs) -> dict[str, Any]:
    from labkit.kernels.paged_decode import launch_split_kv

    split_kernel, merge_kernel = functions
    return {
        name: launch_split_kv(split_kernel, merge_kernel, *(case[k] for k in TENSORS), case["num_splits"])
        for name, case in inputs.items()
    }


register(
    diagnosed(
        Exercise(
            id="lab11.split_kv",
            functions=("split_kv_kernel", "merge_splits_kernel"),
            make_inputs=split_cases,
            run=_run_split,
            oracle=lambda cases: expected_outputs(cases, ("merge", "merge_max", "rescale", "tail", "table")),
            compare=compare_cases,
            source_rule=kernel_rule(("split_kv_kernel", "merge_splits_kernel")),
            tested="your kernel cell holds Triton kernels only and compiles for an H100 (sm_90); under Triton's "
            "interpreter your split and merge kernels with 1, 3 and 5 splits (not powers of two; some splits empty), "
            "large scores and bf16 pools, 3 query heads per KV head, equal labkit's attention",
            hint="Each split walks only its own run of blocks and stores its m, l and acc unnormalized; the merge finds "
            "the largest m over the splits and adds each split's l and acc times exp(m_s - largest). "
            'labkit.hint("lab11.split_kv") shows more.',
            points=2.0,
        )
    )
)

register_hints(
    "lab11.split_kv",
    "Split s of a sequence covers blocks s * blocks_per_split up to (s + 1) * blocks_per_split, but never past "
    "the sequence's last block: a split may have nothing to do, and then it stores m = -inf, l = 0, acc = 0. The "
    "merge must give such a split no weight.",
    "In the merge: overall = tl.max(maxes, axis=0); worth = exp(maxes - overall), 0 where maxes is -inf; then "
    "out = tl.sum(accs * worth[:, None], axis=0) / tl.sum(sums * worth, axis=0).",
)
