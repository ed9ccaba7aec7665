"""A checkpoint's tokenizer and chat template, read with `tokenizers` and jinja2 alone.

transformers' tokenizer wraps the same Rust `tokenizers` library, but importing transformers takes about six
seconds on a small CPU. This class reads the same files and offers the few methods labkit uses, with the same
results (tests/test_tokenizer.py compares them with transformers' own tokenizer).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

TOKENIZER_FILE = "tokenizer.json"
SPECIAL_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


class ChatTokenizer:
    """Text <-> token ids, and chat messages -> the model's prompt text through its own template."""

    def __init__(self, folder: str | Path):
        from tokenizers import Tokenizer

        folder = Path(folder)
        self._tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.special_tokens = {name: _token_text(config.get(name)) for name in SPECIAL_NAMES}
        template_path = folder / "chat_template.jinja"
        self.chat_template: str | None = (
            template_path.read_text() if template_path.is_file() else config.get("chat_template")
        )
        self._template = None  # compiled on first use

    @property
    def eos_token_id(self) -> int | None:
        return self._id_of(self.special_tokens["eos_token"])

    @property
    def pad_token_id(self) -> int | None:
        return self._id_of(self.special_tokens["pad_token"])

    @property
    def bos_token_id(self) -> int | None:
        return self._id_of(self.special_tokens["bos_token"])

    def __len__(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids, skip_special_tokens: bool = False) -> str:
        ids = [int(t) for t in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]
        return self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_id: int) -> str | None:
        return self._tokenizer.id_to_token(int(token_id))

    def get_vocab(self) -> dict[str, int]:
        return self._tokenizer.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = False, tokenize: bool = True):
        """The prompt text (or its ids) for ``messages``, rendered as transformers renders chat templates."""
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template, so it cannot take chat messages; pass text")
        if self._template is None:
            self._template = _compile(self.chat_template)
        text = self._template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            **{name: value for name, value in self.special_tokens.items() if value is not None},
        )
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._tokenizer.token_to_id(token)


def _token_text(entry) -> str | None:
    """tokenizer_config.json writes a special token as its text or as {"content": text, ...}."""
    return entry.get("content") if isinstance(entry, dict) else entry


def _compile(source: str):
    """A sandboxed jinja2 template with the settings and helpers chat templates are written for."""
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)
