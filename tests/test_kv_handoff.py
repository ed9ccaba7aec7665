"""Prefill on one engine, decode on another: the KV hand-off keeps every greedy token, leaks no block, and refuses
what cannot fit (another model, another cache dtype, a request still prefilling) with a message saying why."""

import random

import pytest
import torch

from labkit.engine import LLM
from labkit.engine.disaggregated import serve_disaggregated
from labkit.kv.handoff import read_tokens, slots, write_tokens
from labkit.models import tiny_model
from labkit.sampling_params import SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BLOCK = 16
# lengths ending mid-block, exactly on a block boundary (16, 32), one token, and several blocks
PROMPT_LENS = (16, 17, 5, 32, 40, 1, 47)


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def prompts():
    rng = random.Random(3)
    return [[rng.randrange(2, 256) for _ in range(n)] for n in PROMPT_LENS]


GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def engine(model, **dials):
    return LLM(model, **{"num_blocks": 64, "block_size": BLOCK, **dials})


def first_token_out(llm: LLM, request_id: str) -> None:
    """Step ``llm`` until the request's prefill is done and its first token out."""
    while request_id not in [request.request_id for request in llm.core.ready_to_hand_over()]:
        llm.step()


@pytest.mark.parametrize(
    "target_block_size", [BLOCK, 8, 32], ids=["same-block-size", "smaller-blocks", "larger-blocks"]
)
def test_greedy_tokens_after_hand_off_equal_one_engine(model, prompts, target_block_size):
    alone = engine(model).generate(prompts, GREEDY, use_tqdm=False)
    prefill, decode = engine(model), engine(model, block_size=target_block_size)
    handed = serve_disaggregated(prefill, decode, prompts, GREEDY)
    assert [o.token_ids for o in handed] == [o.token_ids for o in alone]
    assert all(r.finish_reason == "handoff" for r in prefill.trace.requests), "every request was decoded elsewhere"
    assert len(decode.trace.requests) == len(prompts)
    assert prefill.state.blocks.num_used_blocks == 0 and decode.state.blocks.num_used_blocks == 0, "a block leaked"


def test_the_hand_off_holds_the_prompt_kv_in_token_order(model, prompts):
    """Read through the block table, the last partial block included: the K/V of a dense prefill, row for row."""
    prompt = prompts[-1]  # 47 tokens: two full blocks and a partial one
    source = engine(model)
    source.add_request(prompt, GREEDY, request_id="r")
    source.step()  # a few blocks taken first, so the table is not simply 0, 1, 2
    first_token_out(source, "r")
    handoff = source.export_request("r")
    _, dense = model.prefill(prompt)
    assert handoff.num_computed_tokens == len(prompt)
    for layer in range(model.config.num_layers):
        torch.testing.assert_close(handoff.keys[layer], dense.keys[layer])
        torch.testing.assert_close(handoff.values[layer], dense.values[layer])
    assert handoff.nbytes == model.config.kv_bytes_per_token(model.dtype) * len(prompt)


def test_export_frees_the_source_blocks_and_import_takes_them_on_the_target(model, prompts):
    source, target = engine(model), engine(model, block_size=8)
    source.add_request(prompts[4], GREEDY, request_id="long")  # 40 tokens: 3 blocks of 16, 5 of 8
    first_token_out(source, "long")
    assert source.state.blocks.num_used_blocks == 3
    handoff = source.export_request("long")
    assert source.state.blocks.num_used_blocks == 0 and not source.has_unfinished()
    target.import_request(handoff)
    assert target.state.blocks.num_used_blocks == 5
    assert list(target.state.blocks.block_table("long")) == list(range(5))


def test_seeded_sampling_continues_its_random_stream(model, prompts):
    sampled = SamplingParams(max_tokens=12, temperature=0.9, seed=5, ignore_eos=True)
    alone = engine(model).generate(prompts[:3], sampled, use_tqdm=False)
    handed = serve_disaggregated(engine(model), engine(model), prompts[:3], sampled)
    assert [o.token_ids for o in handed] == [o.token_ids for o in alone]


def test_fp8_caches_hand_over_to_each_other(model, prompts):
    alone = engine(model, kv_cache_dtype="fp8").generate(prompts, GREEDY, use_tqdm=False)
    handed = serve_disaggregated(
        engine(model, kv_cache_dtype="fp8"), engine(model, kv_cache_dtype="fp8", block_size=8), prompts, GREEDY
    )
    assert [o.token_ids for o in handed] == [o.token_ids for o in alone]


def test_a_full_decode_engine_keeps_the_request_on_the_prefill_engine_until_a_seat_frees(model, prompts):
    """With one seat on the decode side, requests wait on the prefill engine (decoding there) and are handed over
    later, with a longer KV: the tokens are still one engine's."""
    alone = engine(model).generate(prompts, GREEDY, use_tqdm=False)
    prefill, decode = engine(model), engine(model, max_num_seqs=1)
    handed = serve_disaggregated(prefill, decode, prompts, GREEDY)
    assert [o.token_ids for o in handed] == [o.token_ids for o in alone]
    assert prefill.state.blocks.num_used_blocks == 0 and decode.state.blocks.num_used_blocks == 0


def test_a_prefix_cache_on_the_target_finds_the_imported_prompt(model, prompts):
    source, target = engine(model), engine(model, enable_prefix_caching=True)
    source.add_request(prompts[4], GREEDY, request_id="a")
    first_token_out(source, "a")
    target.import_request(source.export_request("a"))
    assert target.core.cached_tokens(target.request(prompts[4])) == 32  # its two full blocks


@pytest.mark.parametrize(
    "target_dials, words",
    [
        (dict(kv_cache_dtype="fp8"), "kv_cache_dtype is 'auto' in the hand-off but 'fp8'"),
        (dict(model_overrides=dict(num_hidden_layers=1)), "num_layers"),
    ],
    ids=["fp8-target", "other-model"],
)
def test_an_import_with_another_kv_layout_is_refused(model, prompts, target_dials, words):
    overrides = target_dials.pop("model_overrides", None)
    target_model = tiny_model("llama", seed=0, **overrides) if overrides else model
    source, target = engine(model), engine(target_model, **target_dials)
    source.add_request(prompts[0], GREEDY, request_id="r")
    first_token_out(source, "r")
    handoff = source.export_request("r")
    with pytest.raises(ValueError, match=words):
        target.import_request(handoff)
    assert target.state.blocks.num_used_blocks == 0 and not target.has_unfinished()


def test_an_export_before_the_first_token_is_refused(model, prompts):
    source = engine(model, max_num_batched_tokens=8, max_num_seqs=1)  # chunked: 8 prompt tokens a step
    source.add_request(prompts[4], GREEDY, request_id="slow")
    source.add_request(prompts[0], GREEDY, request_id="queued")
    source.step()
    with pytest.raises(ValueError, match="computed 8 of its 40 prompt tokens; hand it over after its prefill"):
        source.export_request("slow")
    with pytest.raises(ValueError, match="is waiting"):
        source.export_request("queued")
    with pytest.raises(ValueError, match="'nobody' is not unfinished here"):
        source.export_request("nobody")
    assert source.state.blocks.num_used_blocks == 1, "a refused export leaves the request where it was"


def test_an_import_without_room_or_with_a_taken_id_is_refused(model, prompts):
    source, target = engine(model), engine(model, max_num_seqs=1)
    for name in ("a", "b"):
        source.add_request(prompts[1], GREEDY, request_id=name)
    first_token_out(source, "b")
    target.import_request(source.export_request("a"))
    handoff = source.export_request("b")
    assert not target.can_import(handoff.num_computed_tokens)
    with pytest.raises(ValueError, match="no room for request 'b'.*0 free seats"):
        target.import_request(handoff)
    again = engine(model)
    again.import_request(handoff)
    with pytest.raises(ValueError, match="'b' is already in use"):
        again.import_request(handoff)


def test_slots_and_copies_follow_the_table_not_the_pool(model):
    pool = torch.arange(4 * 2 * 1 * 1, dtype=torch.float32).view(4, 2, 1, 1)
    assert slots([3, 0], 3, 2).tolist() == [6, 7, 0]
    assert read_tokens(pool, [3, 0], 3).flatten().tolist() == [6.0, 7.0, 0.0]
    target = torch.zeros(3, 4, 1, 1)
    write_tokens(target, [2], read_tokens(pool, [3, 0], 3))
    assert target[2].flatten().tolist() == [6.0, 7.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="need 2 blocks of 2, but the block table has 1; allocate them first"):
        slots([3], 3, 2)


def test_default_model_tokens_equal_after_a_hand_off(default_model):
    chats = [
        [{"role": "user", "content": "Where is my cashback?"}],
        [{"role": "user", "content": "Why was my card payment declined during the sale? Please explain."}],
    ]
    params = SamplingParams(max_tokens=10)
    alone = LLM(default_model, num_blocks=32).generate(chats, params, use_tqdm=False)
    handed = serve_disaggregated(LLM(default_model, num_blocks=32), LLM(default_model, num_blocks=32), chats, params)
    assert [o.token_ids for o in handed] == [o.token_ids for o in alone]
    assert [o.text for o in handed] == [o.text for o in alone]
