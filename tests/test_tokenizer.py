"""labkit reads the default model without transformers: its tokenizer and chat template give transformers'
results, loading it imports no transformers, and transformers' model (the oracle) shares labkit's tensors."""

import random
import subprocess
import sys

import pytest
import torch

from labkit.models import default_model as conversion
from labkit.models.tokenizer import ChatTokenizer
from labkit.workloads.sharegpt import load_sharegpt

TEXTS = [
    "Hello world",
    " a leading space, and  two   gaps\n\n\ttabs",
    "<|im_start|>user\nspecial tokens written as text<|im_end|>",
    "émoji 🎉, 中文 and Ελληνικά",
    "don't stop , ok . 3.14159 == pi?",
]
CHATS = [
    [{"role": "user", "content": "Hi there"}],
    [
        {"role": "system", "content": "Answer in one line."},
        {"role": "user", "content": "What is a KV cache?"},
        {"role": "assistant", "content": "The keys and values of earlier tokens."},
        {"role": "user", "content": "Why keep it?"},
    ],
]


@pytest.fixture(scope="module")
def both(default_model):
    """labkit's tokenizer and transformers' own, read from the same converted folder."""
    from transformers import AutoTokenizer

    folder = conversion.default_model_dir()
    return ChatTokenizer(folder), AutoTokenizer.from_pretrained(folder)


def test_encoding_matches_transformers_on_plain_and_real_text(both):
    ours, theirs = both
    conversations = load_sharegpt(limit=40).conversations
    texts = TEXTS + [turn["value"] for c in conversations for turn in c["conversations"][:2]]
    for text in texts:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(text, add_special_tokens=special)


def test_decoding_matches_transformers_on_random_ids(both):
    ours, theirs = both
    draw = random.Random(0)
    for _ in range(200):
        ids = [draw.randrange(len(theirs)) for _ in range(draw.randrange(1, 30))]
        for skip in (False, True):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)
        assert ours.decode(torch.tensor(ids)) == theirs.decode(ids)
        assert ours.convert_ids_to_tokens(ids[0]) == theirs.convert_ids_to_tokens(ids[0])


def test_chat_template_and_special_tokens_match_transformers(both):
    ours, theirs = both
    for chat in CHATS:
        for prompt in (False, True):
            text = ours.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert text == theirs.apply_chat_template(chat, add_generation_prompt=prompt, tokenize=False)
            assert ours.apply_chat_template(chat, add_generation_prompt=prompt) == ours.encode(text, False)
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id) == (
        theirs.eos_token_id,
        theirs.pad_token_id,
        theirs.bos_token_id,
    )
    assert len(ours) == len(theirs) and ours.get_vocab() == theirs.get_vocab()


def test_a_tokenizer_without_a_chat_template_says_so(tmp_path):
    (tmp_path / "tokenizer.json").write_bytes((conversion.default_model_dir() / "tokenizer.json").read_bytes())
    bare = ChatTokenizer(tmp_path)
    assert bare.eos_token_id is None and bare.encode("hi") == bare.encode("hi", add_special_tokens=False)
    with pytest.raises(ValueError, match="no chat template"):
        bare.apply_chat_template(CHATS[0])


def test_loading_the_course_model_or_a_tiny_one_imports_no_transformers(default_model):
    """Every kernel and server that loads a model would pay transformers' import (seconds); only ``.hf`` may."""
    code = (
        "import sys; from labkit.models import load_model, tiny_model; m = load_model(progress=False); "
        "assert m.tokenizer.encode('hi'); tiny_model('qwen3').prefill([1, 2, 3]); print('transformers' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "False"


def test_transformers_model_shares_labkit_tensors(default_model):
    hf = default_model.hf
    assert hf.lm_head.weight is hf.model.embed_tokens.weight  # tied, as in the checkpoint
    q = hf.model.layers[3].self_attn.q_proj.weight
    assert q.data_ptr() == default_model.weights["model.layers.3.self_attn.q_proj.weight"].data_ptr()
    assert sum(p.numel() for p in hf.parameters()) == default_model.num_parameters() == 134_515_008
