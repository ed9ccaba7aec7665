"""From a growing list of token ids to the text a client sees, piece by piece, with stop strings.

A token is not always whole characters: byte-level tokenizers split an emoji or a Chinese
character over several tokens, and the half-decoded text ends in U+FFFD. So each update
decodes all the tokens so far and hands out only what can no longer change: it holds back
a trailing U+FFFD, and, when the request has stop strings, the last ``len(longest) - 1``
characters, which might be the start of one. A stop string ends the answer and is left out
of it, as in the OpenAI API; with ``min_tokens``, as in vLLM, only a stop string that ends
after the first ``min_tokens`` tokens counts. Decoding everything each time costs O(n^2) over an answer of
n tokens, which is nothing next to a forward pass at the lengths served here; and a whole
(not streamed) answer without stop strings is decoded once, at the end.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class TextStream:
    """One request's text so far; :meth:`update` returns the piece that is new and settled."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = (), streamed: bool = True, min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = stop
        self.streamed = streamed
        self.min_tokens = min_tokens
        self._search_from = 0  # characters before this were decoded within min_tokens: no stop string there
        self.hold = max((len(s) for s in stop), default=1) - 1
        self.text = ""  # handed out so far
        self.stopped = False  # a stop string was found: the answer is over
        self.stop_reason: str | None = None  # the stop string found (vLLM's ``stop_reason``)

    def update(self, token_ids: list[int], finished: bool) -> str:
        """The text to add after these tokens (all of the request's output so far)."""
        if not (finished or self.streamed or self.stop):
            return ""  # nobody reads the pieces before the end, and no stop string can end it early
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        if len(token_ids) <= self.min_tokens:
            self._search_from = len(text)
        found = [
            (i, s)
            for s in self.stop
            if len(token_ids) > self.min_tokens and (i := text.find(s, max(0, self._search_from - len(s) + 1))) >= 0
        ]
        if found:
            cut, self.stop_reason = min(found)
            text, self.stopped, finished = text[:cut], True, True
        if not finished:
            text = text[: len(text) - self.hold].rstrip(REPLACEMENT)
        if not text.startswith(self.text):  # the tokenizer rewrote earlier text: send nothing rather than garble
            return ""
        piece = text[len(self.text) :]
        self.text = text
        return piece
