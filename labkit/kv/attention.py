"""Attention for one sequence, with grouped-query heads: what every cache layout calls at the end."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q·kᵀ/√D + mask)·v for q [Tq, Hq, D] and k, v [Tk, Hkv, D]; returns [Tq, Hq, D].

    Each group of Hq/Hkv query heads shares one K/V head (grouped-query attention).
    ``mask`` is boolean [Tq, Tk], True where a query may look at a key; None means all.
    """
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads cannot share {k.shape[1]} KV heads evenly")
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask, enable_gqa=q.shape[1] != k.shape[1]
    )
    return out.transpose(0, 1)


def causal_mask(num_queries: int, num_keys: int, device: torch.device | None = None) -> torch.Tensor:
    """Mask for the last ``num_queries`` tokens of a sequence of ``num_keys``: no peeking ahead."""
    query_pos = torch.arange(num_keys - num_queries, num_keys, device=device)[:, None]
    return torch.arange(num_keys, device=device)[None, :] <= query_pos
