"""Prompt lookup (n-gram) drafting: guess the next tokens by finding the sequence's tail earlier in itself.

When an answer repeats its prompt (editing a text, quoting code, filling a form), what followed its last few tokens
before is a good guess for what follows now. No model runs: the draft is a list search (vLLM's "ngram").
"""

from __future__ import annotations


def propose_ngram(token_ids: list[int], k: int, min_n: int = 1, max_n: int = 4) -> list[int]:
    """Prompt lookup: for n from max_n down to min_n (a longer match is a more specific guess), find the most
    recent EARLIER occurrence of the sequence's last n tokens (not the tail itself) and return up to k tokens that
    followed it ([] when no n matches)."""
    if k < 1 or min_n < 1 or max_n < min_n:
        raise ValueError(f"need k >= 1 and 1 <= min_n <= max_n, got k={k}, min_n={min_n}, max_n={max_n}")
    length = len(token_ids)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        tail = token_ids[length - n :]
        for start in range(length - n - 1, -1, -1):  # most recent earlier occurrence first
            if token_ids[start : start + n] == tail:
                return list(token_ids[start + n : start + n + k])
    return []
