"""A stand-in for the model that writes down every forward pass a learner's code makes.

A check hands the learner's function a ``RecordingModel`` instead of the model. It runs
the real forward pass, and keeps what went in (token ids, positions), what the learner's
``attend`` produced at each layer (with the q, k, v it was given) and what came out
(logits). The check then compares those with the oracle and can say *where* they part:
"call 2 got position 7, expected 6" or "layer 0: attention ignores the cache".

It keeps only what a check will read (``record_layers``, ``logits_rows``): the grader refuses a
result much bigger than the expected answer, so a recording of every [T, vocab] logit of a long
decode would cost an honest learner their point.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from labkit.models.llama import AttendFn, LlamaModel


class AttentionShapeError(ValueError):
    """The learner's attend returned something that is not a [T, Hq, D] tensor."""


class RecordingModel:
    """Looks like a LlamaModel to the learner (forward, config, device, dtype, tokenizer)."""

    def __init__(self, model: LlamaModel, record_layers: int | None = None, logits_rows: Sequence[int] | None = None):
        """``record_layers``: how many layers' attention to keep (all by default); ``logits_rows``: which rows
        of each pass's logits to keep, e.g. ``(0, -1)`` (all by default)."""
        self._model = model
        self._record_layers = model.config.num_layers if record_layers is None else record_layers
        self._logits_rows = None if logits_rows is None else list(logits_rows)
        self.calls: list[dict[str, Any]] = []

    @property
    def config(self):
        return self._model.config

    @property
    def device(self) -> torch.device:
        return self._model.device

    @property
    def dtype(self) -> torch.dtype:
        return self._model.dtype

    @property
    def tokenizer(self):
        return self._model.tokenizer

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attend: AttendFn,
        logits_indices: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The real forward pass, with the inputs, each layer's attention and the logits written down."""
        layers: list[dict[str, torch.Tensor]] = []

        def watched(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = attend(layer, q, k, v)
            if not isinstance(out, torch.Tensor) or out.shape != q.shape:
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise AttentionShapeError(
                    f"attention at layer {layer} returned {got}; it must have q's shape {tuple(q.shape)} "
                    f"(tokens, query heads, head_dim). Is an axis transposed?"
                )
            if layer < self._record_layers:
                layers.append({name: t.detach().clone() for name, t in (("q", q), ("k", k), ("v", v), ("out", out))})
            return out

        input_ids = torch.as_tensor(input_ids)
        positions = torch.as_tensor(positions)
        start = time.perf_counter()
        logits = self._model.forward(input_ids, positions, watched, logits_indices)
        self.calls.append(
            {
                "seconds": time.perf_counter() - start,
                "input_ids": input_ids.detach().clone().cpu(),
                "positions": positions.detach().clone().cpu(),
                "logits": (logits if self._logits_rows is None else logits[self._logits_rows]).detach().clone().cpu(),
                "attention": layers,
            }
        )
        return logits

    __call__ = forward
