"""OpenAI's two shapes of log-probabilities, made from the engine's per-token records.

The engine records, for each output token, its log-probability and the N most likely
alternatives (:class:`~labkit.sampling_params.TokenLogprob`, from the raw logits, as vLLM's
default). Chat answers list them as ``logprobs.content = [{token, logprob, bytes, top_logprobs}]``;
completions as four parallel arrays ``{tokens, token_logprobs, top_logprobs, text_offset}``,
where each ``top_logprobs`` entry maps token text to logprob and, as OpenAI's API says, holds
the chosen token too (so up to N + 1 entries). A token's text is its own decoding; a byte-level
token that is only part of a character decodes to U+FFFD, so its ``bytes`` are read from the
token itself, which is what OpenAI's ``bytes`` field is for.
"""

from __future__ import annotations

import math

from labkit.sampling_params import TokenLogprob
from labkit.serve.protocol import CHAT
from labkit.serve.text import REPLACEMENT

FLOOR = -9999.0  # JSON has no -inf: a logprob below this is sent as this (vLLM's floor)


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE spells each byte as one printable character; this maps them back."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    spelling = {b: chr(b) for b in printable} | {b: chr(256 + i) for i, b in enumerate(others)}
    return {char: b for b, char in spelling.items()}


BYTE_OF = _byte_level_alphabet()


class Logprobs:
    """Formats one answer's logprobs, chunk after chunk (completions' ``text_offset`` runs on)."""

    def __init__(self, tokenizer, kind: str, text_offset: int = 0):
        self.tokenizer = tokenizer
        self.kind = kind
        self.text_offset = text_offset  # where the next token's text starts in the answer (after an echo)
        self._texts: dict[int, str] = {}

    def text(self, token_id: int) -> str:
        if token_id not in self._texts:
            self._texts[token_id] = self.tokenizer.decode([token_id])
        return self._texts[token_id]

    def bytes(self, token_id: int) -> list[int]:
        text = self.text(token_id)
        if REPLACEMENT in text:  # part of a character: the token's own bytes, if it is byte-level BPE
            spelled = self.tokenizer.convert_ids_to_tokens(token_id)
            if isinstance(spelled, str) and spelled and all(char in BYTE_OF for char in spelled):
                return [BYTE_OF[char] for char in spelled]
        return list(text.encode("utf-8"))

    def format(self, entries: list[TokenLogprob]) -> dict:
        """The ``logprobs`` of a choice (or of one chunk) holding these tokens."""
        return self._chat(entries) if self.kind == CHAT else self._completion(entries)

    def _chat(self, entries: list[TokenLogprob]) -> dict:
        def one(token_id: int, logprob: float) -> dict:
            return {"token": self.text(token_id), "logprob": _finite(logprob), "bytes": self.bytes(token_id)}

        content = [
            {**one(entry.token_id, entry.logprob), "top_logprobs": [one(token, lp) for token, lp in entry.top]}
            for entry in entries
        ]
        return {"content": content}

    def _completion(self, entries: list[TokenLogprob]) -> dict:
        tokens, offsets, tops = [], [], []
        for entry in entries:
            tokens.append(self.text(entry.token_id))
            offsets.append(self.text_offset)
            self.text_offset += len(tokens[-1])
            top = {self.text(token): _finite(lp) for token, lp in entry.top}
            top.setdefault(tokens[-1], _finite(entry.logprob))  # the chosen token is always there
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": [_finite(entry.logprob) for entry in entries],
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def _finite(logprob: float) -> float:
    return max(logprob, FLOOR) if not math.isnan(logprob) else FLOOR
