"""The stand-in kernels lab 13's checks hand to the learner's code: a matmul library whose reduction order moves with
the number of rows, and one split's share of attention reduced in an order fixed by the keys' positions.

Both are made of elementwise products and :func:`~labkit.batch_invariant.fixed_order_sum` only, so they give the
same bits on every machine: a check that uses them never depends on whether this machine's own BLAS moves.
"""

from __future__ import annotations

import math

import torch

from labkit.batch_invariant import fixed_order_sum

# The row counts at which the stand-in library changes its path, as MKL's fp32 product did on the AMD EPYC
# (AVX2) machine the course was built on: one row, two or three rows, four and more.
PATHS = ((1, "one row"), (2, "two or three rows"), (4, "four rows and more"))


def path_for(rows: int) -> str:
    """Which of the stand-in library's paths a product of ``rows`` rows takes."""
    return [name for first, name in PATHS if rows >= first][-1]


def _reduce(products: torch.Tensor, path: str) -> torch.Tensor:
    """Sum ``products`` over its last dim in the order ``path`` uses: three trees, three sets of last bits."""
    if path == "one row":
        return fixed_order_sum(products)
    if path == "two or three rows":  # neighbours first
        even = products.shape[-1] - products.shape[-1] % 2
        paired = products[..., 0:even:2] + products[..., 1:even:2]
        return fixed_order_sum(torch.cat([paired, products[..., even:]], dim=-1))
    quarters = products.tensor_split(4, dim=-1)  # four runs, each a tree, added left to right
    total = fixed_order_sum(quarters[0])
    for quarter in quarters[1:]:
        total = total + fixed_order_sum(quarter)
    return total


class RowPathMatmul:
    """``a @ weight.T`` the way a BLAS library computes it: its kernel, and so its order of adding, chosen by the
    number of rows of ``a``. Each call's row count is recorded in ``rows``."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def __call__(self, a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if a.dim() != 2 or weight.dim() != 2 or a.shape[1] != weight.shape[1]:
            raise ValueError(
                f"matmul(a, weight) multiplies a [rows, k] by a [out, k] weight (a @ weight.T); got a of shape "
                f"{tuple(a.shape)} and weight of shape {tuple(weight.shape)}"
            )
        self.rows.append(a.shape[0])
        return _reduce(a[:, None, :] * weight[None, :, :], path_for(a.shape[0]))


def split_partial(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
    """One split's share of attention for one query row: ``(m, l, acc)``, each head's largest score ``m`` [H], the
    sum ``l`` [H] of exp(score - m) and the sum ``acc`` [H, D] of exp(score - m) · value, over every key given
    (``keys``, ``values``: [n, H, D], all of them visible to the query).

    Every sum runs in an order fixed by the keys' positions: a split of 5 keys gives the same bits whatever
    split size it was cut with. No keys (n = 0): ``m`` is -inf and the sums 0, a split that adds nothing.
    """
    if keys.dim() != 3 or keys.shape != values.shape or keys.shape[1:] != q.shape:
        raise ValueError(
            f"partial(q, keys, values) takes q [H, D] and keys and values [n, H, D]; got q {tuple(q.shape)}, keys "
            f"{tuple(keys.shape)}, values {tuple(values.shape)}"
        )
    if keys.shape[0] == 0:
        heads, dim = q.shape
        empty = dict(device=q.device)
        return torch.full((heads,), -math.inf, **empty), torch.zeros(heads, **empty), torch.zeros(heads, dim, **empty)
    scores = fixed_order_sum(q.float() * (1 / math.sqrt(q.shape[-1])) * keys.float())  # [n, H]
    m = scores.amax(dim=0)  # the maximum is exact in any order
    weights = torch.exp(scores - m)
    return m, fixed_order_sum(weights, dim=0), fixed_order_sum(weights[..., None] * values.float(), dim=0)
