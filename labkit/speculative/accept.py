"""Verification: which draft tokens the target model agrees with, and the one token it adds itself.

The target scored the context and every draft prefix in one pass. Greedy: keep the draft while it equals the
target's argmax. Sampling: the rule of Leviathan et al. (ICML 2023) and Chen et al. (2023), which keeps the output
distribution exactly the target's, however bad the draft. Either way a step yields at least one token.
"""

from __future__ import annotations


def accept_greedy(draft: list[int], target_argmax: list[int]) -> list[int]:
    """target_argmax has len(draft)+1 entries: the target's choice after the context and after each draft prefix.
    Returns the accepted draft tokens followed by exactly one target token (the correction at the first mismatch, or
    the bonus token when every draft token was accepted)."""
    if len(target_argmax) != len(draft) + 1:
        raise ValueError(
            f"target_argmax needs len(draft) + 1 = {len(draft) + 1} entries (one per draft position plus the bonus), "
            f"got {len(target_argmax)}"
        )
    accepted: list[int] = []
    for proposed, chosen in zip(draft, target_argmax):
        if proposed != chosen:
            return accepted + [int(chosen)]  # the target's correction ends the step
        accepted.append(int(proposed))
    return accepted + [int(target_argmax[-1])]  # all accepted: the bonus token comes free


def accept_sampling(draft: list[int], draft_probs, target_probs, generator=None) -> list[int]:
    """draft_probs q: [len(draft), V], target_probs p: [len(draft)+1, V] (torch tensors, already with temperature /
    top_p applied). Leviathan et al. / Chen et al.: accept draft token i with probability min(1, p_i(x)/q_i(x));
    at the first rejection sample from normalize(max(0, p_i - q_i)) and stop; if all accepted, sample a bonus token
    from p_k. For n-gram drafts q is one-hot. Returns accepted tokens + one target token."""
    import torch  # here, so that importing labkit.speculative stays torch-free for the simulator

    k = len(draft)
    if draft_probs.shape[0] != k or target_probs.shape[0] != k + 1:
        raise ValueError(
            f"for {k} draft tokens need draft_probs [{k}, V] and target_probs [{k + 1}, V], "
            f"got {tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    device = target_probs.device
    accepted = []
    for i, token in enumerate(draft):
        p, q = float(target_probs[i, token]), float(draft_probs[i, token])
        u = float(torch.rand((), generator=generator, device=device))
        if q > 0 and u < min(1.0, p / q):
            accepted.append(int(token))
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp(min=0)
        if float(residual.sum()) <= 0:  # p == q exactly: any token of p keeps the distribution
            residual = target_probs[i]
        return accepted + [int(torch.multinomial(residual / residual.sum(), 1, generator=generator)[0])]
    bonus = torch.multinomial(target_probs[k], 1, generator=generator)[0]
    return accepted + [int(bonus)]


def one_hot_probs(draft: list[int], vocab_size: int, device=None):
    """The draft distribution of a proposer that names tokens without probabilities (n-gram): q_i = one-hot."""
    import torch

    q = torch.zeros(len(draft), vocab_size, device=device)
    if draft:
        q[torch.arange(len(draft)), torch.tensor(draft)] = 1.0
    return q
