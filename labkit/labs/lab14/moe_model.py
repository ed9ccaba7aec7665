"""The small mixture of experts lab 14 is built on: random weights from a seed, in the shapes of a real MoE layer.

No mixture small enough for a 2-core CPU ships offline, so the lab builds one (SwiGLU experts, as Mixtral's and
Qwen3's are); what the lab checks (routing, dispatch, the all-to-all) does not depend on what the weights know."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.utils._pytree import register_dataclass

from labkit.models.layers import rms_norm

WEIGHT_SEEDS = 1_000_003  # weights draw from seeds this far from the ones the checks draw inputs from
Route = Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]
Dispatch = Callable[..., torch.Tensor]  # (x, weights, chosen, expert) -> [T, H]


@dataclass(frozen=True)
class MoeLayer:
    """One mixture-of-experts layer: a router and ``E`` SwiGLU experts stacked along the first axis."""

    router: torch.Tensor  # [E, H]: one logit per expert, router @ x
    gate: torch.Tensor  # [E, F, H]
    up: torch.Tensor  # [E, F, H]
    down: torch.Tensor  # [E, H, F]
    top_k: int

    @property
    def experts(self) -> int:
        return self.router.shape[0]

    @property
    def expert_bytes(self) -> int:
        """The bytes of one expert's three matrices: what a step reads for each expert its batch chose."""
        return (self.gate[0].numel() + self.up[0].numel() + self.down[0].numel()) * self.gate.element_size()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The router's logits [T, E] for hidden states x [T, H]."""
        return x @ self.router.T

    def expert(self, e: int, rows: torch.Tensor) -> torch.Tensor:
        """Expert ``e`` on ``rows`` [n, H]: down(silu(gate rows) * up rows), one matmul per matrix for all n rows."""
        return (F.silu(rows @ self.gate[e].T) * (rows @ self.up[e].T)) @ self.down[e].T


# both are pytrees, so that moving a check's inputs to labkit's device (and a rank's to its own) moves their weights
register_dataclass(MoeLayer)


def make_layer(
    seed: int, hidden: int = 64, experts: int = 8, top_k: int = 2, width: int = 128, device=None
) -> MoeLayer:
    """A layer with random weights drawn from ``seed`` on the CPU (the same numbers everywhere), then moved."""
    generator = torch.Generator().manual_seed(WEIGHT_SEEDS + seed)

    def draw(*shape: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * scale / shape[-1] ** 0.5).to(device)

    router = draw(experts, hidden, scale=1.5)  # logits of about 1.5 either way: weights neither one-hot nor even
    return MoeLayer(
        router, draw(experts, width, hidden), draw(experts, width, hidden), draw(experts, hidden, width), top_k
    )


def per_token_reference(x: torch.Tensor, weights: torch.Tensor, chosen: torch.Tensor, expert) -> torch.Tensor:
    """The layer token by token, expert by expert: slow, and plainly right, the oracle the dispatch is held to."""
    rows = [sum(w * expert(int(e), x[t : t + 1])[0] for w, e in zip(weights[t], chosen[t])) for t in range(len(x))]
    return torch.stack(rows)


@dataclass(frozen=True)
class TinyMoeLM:
    """An embedding, two MoE layers with residuals and RMSNorm, and an output matrix: no attention, so each step sees
    only its last token; enough to decode greedily and compare tokens."""

    embedding: torch.Tensor  # [V, H]
    layers: tuple[MoeLayer, ...]
    head: torch.Tensor  # [V, H]

    def step(self, tokens: torch.Tensor, route: Route, dispatch: Dispatch) -> torch.Tensor:
        """The logits [T, V] of one decode step of ``tokens`` [T], with ``route`` and ``dispatch`` in every layer."""
        h = self.embedding[tokens]
        for layer in self.layers:
            a = rms_norm(h, torch.ones_like(h[0]), 1e-6)
            weights, chosen = route(layer.logits(a), layer.top_k)
            h = h + dispatch(a, weights, chosen, layer.expert)
        return rms_norm(h, torch.ones_like(h[0]), 1e-6) @ self.head.T

    def greedy(self, tokens: torch.Tensor, steps: int, route: Route, dispatch: Dispatch) -> torch.Tensor:
        """``steps`` greedy tokens after each of ``tokens`` [T]: [T, steps]."""
        out = []
        for _ in range(steps):
            tokens = self.step(tokens, route, dispatch).argmax(dim=-1)
            out.append(tokens)
        return torch.stack(out, dim=1)


register_dataclass(TinyMoeLM)


def make_lm(seed: int, vocab: int = 96, device=None) -> TinyMoeLM:
    """The toy language model of ``seed``: two layers of :func:`make_layer`, a random embedding and output."""
    generator = torch.Generator().manual_seed(WEIGHT_SEEDS - seed)
    embedding, head = (torch.randn(vocab, 64, generator=generator).to(device) for _ in range(2))
    layers = (make_layer(seed + 1, device=device), make_layer(seed + 2, device=device))
    return TinyMoeLM(embedding, layers, head)
