"""The simplest KV cache, what labs 1-2 build: one growing K and V tensor per layer for a single sequence, allocated
per sequence and grown by copying (what the paged cache improves on).
"""

from __future__ import annotations

import torch

from labkit.kv.attention import attention, causal_mask


class ContiguousKVCache:
    """K and V of every token seen so far, per layer, shaped [tokens, kv_heads, head_dim]."""

    def __init__(self, num_layers: int):
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers

    @property
    def length(self) -> int:
        """Tokens cached (as seen by the last layer, which is written last in a pass)."""
        last = self.keys[-1]
        return 0 if last is None else last.shape[0]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Add this pass's K/V for one layer; return everything cached for that layer."""
        keys, values = self.keys[layer], self.values[layer]
        if keys is None or values is None:  # the layer's first pass (keys and values are set together)
            keys, values = k, v
        else:
            keys, values = torch.cat([keys, k]), torch.cat([values, v])
        self.keys[layer], self.values[layer] = keys, values
        return keys, values

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The ``attend`` callback for LlamaModel.forward: store, then look back causally."""
        keys, values = self.append(layer, k, v)
        return attention(q, keys, values, causal_mask(q.shape[0], keys.shape[0], q.device))

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)
