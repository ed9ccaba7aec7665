"""What a request may ask of ``labkit serve``: each field is honoured or refused with a 400 naming it.

Pure parsing (no server): the same checks run over real HTTP in test_serve.py.
"""

import pytest

from labkit.serve.protocol import CHAT, COMPLETION, COMPLETION_MAX_TOKENS, NOT_DONE, APIError, parse_request

MESSAGES = [{"role": "user", "content": "Name a colour."}]


def chat(**fields):
    return parse_request({"messages": MESSAGES, **fields}, CHAT)


ASKS_FOR_WHAT_IS_NOT_DONE = {
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "required",
    "functions": [{"name": "f"}],
    "response_format": {"type": "json_object"},
    "best_of": 2,
    "use_beam_search": True,
    "suffix": " the end",
}


def test_every_field_not_done_is_listed_with_a_case():
    assert set(ASKS_FOR_WHAT_IS_NOT_DONE) == set(NOT_DONE)


@pytest.mark.parametrize("name", sorted(ASKS_FOR_WHAT_IS_NOT_DONE))
def test_asking_for_what_labkit_does_not_do_is_a_400_naming_the_field(name):
    with pytest.raises(APIError) as refused:
        chat(**{name: ASKS_FOR_WHAT_IS_NOT_DONE[name]})
    assert refused.value.status == 400 and refused.value.param == name
    assert refused.value.message.startswith(f"{name} is not supported: labkit")


@pytest.mark.parametrize(
    "fields",
    [
        {"logprobs": False},
        {"top_logprobs": 0},
        {"tools": []},
        {"tool_choice": "none"},
        {"response_format": {"type": "text"}},
        {"presence_penalty": 0, "frequency_penalty": 0.0},
        {"logit_bias": {}},
        {"echo": False},
        {"best_of": 1},
        {"user": "someone", "metadata": {"x": "y"}},
    ],
)
def test_a_field_at_its_off_value_asks_for_nothing(fields):
    assert chat(**fields).kind == CHAT


def test_the_honoured_extras_reach_the_engine():
    params = chat(
        logprobs=True,
        top_logprobs=4,
        presence_penalty=0.5,
        frequency_penalty=-1.0,
        repetition_penalty=1.2,
        logit_bias={"50256": -100, "7": 2.5},
        min_p=0.1,
        min_tokens=3,
    ).sampling_params(10, 100)
    assert (params.logprobs, params.presence_penalty, params.frequency_penalty) == (4, 0.5, -1.0)
    assert (params.repetition_penalty, params.min_p, params.min_tokens) == (1.2, 0.1, 3)
    assert params.logit_bias == {50256: -100.0, 7: 2.5}
    assert chat(logprobs=True).sampling_params(10, 100).logprobs == 0  # the chosen token's only
    assert chat().sampling_params(10, 100) == parse_request({"messages": MESSAGES}, CHAT).sampling_params(10, 100)
    assert not chat().sampling_params(10, 100).processes_logits and chat().sampling_params(10, 100).logprobs is None
    assert parse_request({"prompt": "Hi", "logprobs": 2}, COMPLETION).logprobs == 2
    assert parse_request({"prompt": "Hi", "echo": True}, COMPLETION).echo  # (echo with logprobs is refused: below)


@pytest.mark.parametrize(
    "kind, fields, param, message",
    [
        (CHAT, {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
        (CHAT, {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "from 0 to 20"),
        (CHAT, {"logprobs": 3}, "logprobs", "must be true or false"),
        (CHAT, {"echo": True}, "echo", "on /v1/completions only"),
        (COMPLETION, {"logprobs": True}, "logprobs", "must be an integer"),
        (COMPLETION, {"top_logprobs": 2}, "top_logprobs", "send logprobs: N instead"),
        (COMPLETION, {"echo": True, "logprobs": 1}, "echo", "no logprobs for the prompt's tokens"),
        (CHAT, {"presence_penalty": 2.5}, "presence_penalty", "from -2 to 2"),
        (CHAT, {"frequency_penalty": "1"}, "frequency_penalty", "from -2 to 2"),
        (CHAT, {"repetition_penalty": 0}, "repetition_penalty", "greater than 0"),
        (CHAT, {"min_p": -0.1}, "min_p", "from 0 to 1"),
        (CHAT, {"min_tokens": -1}, "min_tokens", "at least 0"),
        (CHAT, {"logit_bias": {"x": 1}}, "logit_bias", "token ids written as strings"),
        (CHAT, {"logit_bias": {"5": 200}}, "logit_bias", "from -100 to 100"),
        (CHAT, {"logit_bias": [1]}, "logit_bias", "must be an object"),
    ],
)
def test_bad_extras_are_400s_naming_the_field(kind, fields, param, message):
    body = {"messages": MESSAGES} if kind == CHAT else {"prompt": "Hi"}
    with pytest.raises(APIError) as refused:
        parse_request({**body, **fields}, kind)
    assert refused.value.status == 400 and refused.value.param == param and message in refused.value.message


def test_min_tokens_above_max_tokens_is_a_400():
    with pytest.raises(APIError, match="min_tokens .* must not be above max_tokens"):
        chat(min_tokens=8, max_tokens=4).sampling_params(10, 100)


def test_stop_token_ids_reach_the_engine():
    assert chat(stop_token_ids=[2, 7]).sampling_params(10, 100).stop_token_ids == (2, 7)
    assert chat().sampling_params(10, 100).stop_token_ids == ()
    for wrong in ([-1], ["2"], 7, [True]):
        with pytest.raises(APIError, match="stop_token_ids must be an array of token ids"):
            chat(stop_token_ids=wrong)


def test_n_zero_has_its_own_message():
    with pytest.raises(APIError, match="n must be at least 1"):
        chat(n=0)
    with pytest.raises(APIError, match="n > 1 is not supported"):
        chat(n=3)


def test_vllm_defaults_a_client_can_tell():
    completion = parse_request({"prompt": "Once upon a time"}, COMPLETION)
    assert completion.max_tokens == COMPLETION_MAX_TOKENS == 16
    assert chat().max_tokens is None  # a chat answer may run to the end of the context, as in vLLM
    developer = chat(messages=[{"role": "developer", "content": "Be terse."}, *MESSAGES])
    assert developer.prompt[0] == {"role": "system", "content": "Be terse."}
    with pytest.raises(APIError, match="does not call tools"):
        chat(messages=[*MESSAGES, {"role": "tool", "content": "42", "tool_call_id": "x"}])
