"""The KV cache of a static batch: B rows of equal length, pads included, and which columns are real.

Lab 3 hands this to the learner so the lab is about the batch's layout (left padding, positions,
the mask) rather than tensor plumbing. The mask itself is the learner's: the cache calls
``make_mask(key_is_real [B, Tk], num_queries) -> bool [B, Tq, Tk]`` before every pass.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

MaskFunction = Callable[[torch.Tensor, int], torch.Tensor]


class PaddedBatchCache:
    """Per layer, keys and values shaped [B, columns, Hkv, D]; ``is_real`` [B, columns] marks real tokens.

    Before each forward pass call ``add_columns(is_real_new)`` with one row per sequence and one
    column per token this pass adds; the pass's tokens arrive flattened row by row (``ids.flatten()``).
    """

    def __init__(self, num_layers: int, batch_size: int, make_mask: MaskFunction):
        self.batch_size = batch_size
        self.make_mask = make_mask
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.is_real = torch.zeros(batch_size, 0, dtype=torch.bool)
        self._mask: torch.Tensor | None = None

    def add_columns(self, is_real_new: torch.Tensor) -> None:
        """Declare the next pass's columns: bool [B, n], True for real tokens, False for pads."""
        if is_real_new.dim() != 2 or is_real_new.shape[0] != self.batch_size:
            raise ValueError(
                f"add_columns wants a bool tensor [batch_size={self.batch_size}, new columns], "
                f"got shape {tuple(is_real_new.shape)}"
            )
        self.is_real = torch.cat([self.is_real.to(is_real_new.device), is_real_new.bool()], dim=1)
        num_queries, num_keys = is_real_new.shape[1], self.is_real.shape[1]
        mask = self.make_mask(self.is_real, num_queries)
        expected = (self.batch_size, num_queries, num_keys)
        if not isinstance(mask, torch.Tensor) or tuple(mask.shape) != expected:
            got = tuple(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise ValueError(f"the mask function returned {got}; the cache needs bool [B, Tq, Tk] = {expected}")
        self._mask = mask.bool()

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The attend callback: un-flatten to rows, append, attend under the mask, flatten back."""
        if self._mask is None:
            raise RuntimeError("call cache.add_columns(is_real) before each forward pass")
        rows = self.batch_size
        columns = q.shape[0] // rows
        if columns * rows != q.shape[0] or columns != self._mask.shape[1]:
            raise ValueError(
                f"this pass has {q.shape[0]} tokens, but add_columns declared {rows} rows x "
                f"{self._mask.shape[1]} columns"
            )
        q, k, v = (t.reshape(rows, columns, *t.shape[1:]) for t in (q, k, v))
        if self.keys[layer] is None:
            self.keys[layer], self.values[layer] = k, v
        else:
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=1)
            self.values[layer] = torch.cat([self.values[layer], v], dim=1)
        # A pad query may see no key at all; let it see everything rather than risk a 0/0 on some
        # kernels. Its output is never used, and no real query's row changes.
        mask = self._mask.to(q.device)
        mask = mask | ~mask.any(dim=-1, keepdim=True)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2),
            self.keys[layer].transpose(1, 2),
            self.values[layer].transpose(1, 2),
            attn_mask=mask[:, None],
            enable_gqa=q.shape[2] != k.shape[2],
        )
        return out.transpose(1, 2).reshape(rows * columns, q.shape[2], q.shape[3])
