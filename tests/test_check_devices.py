"""Every lab's checks put the tensors they hand to learner code and to the engine on labkit's device.

Proven without a GPU: each lab's checks are walked on a stand-in CUDA device (tests/stand_in_cuda.py: CPU
tensors that say they are on cuda:0, and an operation that mixes one with a CPU tensor raises, as CUDA does),
with the course's own answers as the learner's functions. The walk fails on a CPU tensor in an exercise's
inputs and on every operation CUDA would have refused, naming the lab, the exercise and the tensor. It reaches
lab 9's server (its engine loop and clients run in threads, which the stand-in follows) and lab 11's kernels
(each launch must be handed cuda:0 tensors only, as a compiled kernel must).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import sys
import threading
from collections.abc import Collection, Iterator
from typing import Any
from unittest import mock

import pytest
import torch
from lab_sources import solved, solved_namespace
from stand_in_cuda import CUDA, OnCuda, StandInCudaError, stand_in_cuda

from labkit.engine import LLM
from labkit.grading import checks, judge
from labkit.grading.feedback import evaluate

# before any stand-in: it follows the kernel launches of modules already imported, and Triton must be set up for
# its interpreter by labkit before torch's compiler (which the stand-in's operations may import) imports it
from labkit.kernels.paged_decode import launch_paged_decode, paged_decode_kernel, reference_decode
from labkit.labs.lab8.runs import repetitive_requests
from labkit.labs.lab9 import engine_loop
from labkit.labs.manifest import LABS
from labkit.models import LlamaModel, tiny_model
from labkit.sampling_params import SamplingParams

# The stand-in is for machines without a GPU; on one, the labs' own tests run on the real device instead.
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="a real CUDA device is here: the stand-in is not")

WALKED = [lab.name for lab in LABS]
# Fewer draws and a lighter load than the checks use: the walk proves where tensors go, the labs' own tests prove
# the verdicts at full size. The course's answers still pass at seed 0 (500 draws of lab 8's rule pass seeds 0-3).
SMALLER: dict[str, dict[str, Any]] = {
    "labkit.labs.lab8.accept_sampling": {"TRIALS": 500},  # 3,000 calls of the rule per case: a third of lab 8's walk
    "labkit.labs.lab8.served": {
        # 2 texts of 10 tokens, not 3 of 20, served with speculation and decoded alone on the course model
        "engine_requests": lambda seed: repetitive_requests(seed, 2, max_tokens=10),
    },
    # the six clients of lab 9's server, each asking for about half the tokens (33 in all, not 66): a client still
    # joins a batch already decoding, since on the stand-in one step of the course model outlasts the 0.05 s
    # between arrivals many times over
    "labkit.labs.lab9.engine_loop": {
        "CLIENTS": tuple((prompt, tokens // 2 + 1) for prompt, tokens in engine_loop.CLIENTS)
    },
    # 2 tokens, not 8, in each of the six quality runs on the course model (the oracle's, both ways round, and the
    # learner's, each for two round trips); the prompt stays 48 tokens, 31 of them the chat template's
    "labkit.labs.lab10.quality": {"QUALITY_TOKENS": 2},
}

# Exercises whose check the walk does not run (their inputs are still searched for CPU tensors), each with the walk
# that runs the same code that places tensors:
# - lab9.find_capacity: its sweep only talks HTTP to a `labkit serve` of the course model (its inputs are rates, its
#   oracle reads the loads sent); the server's engine loop and engine steps on that model are the ones
#   lab9.continuous_schedule's walk serves six streaming clients with, a later one joining a running batch.
NOT_RUN = {"lab9.find_capacity": "lab9.continuous_schedule"}


def cpu_tensors(value: Any, where: str, seen: set[int] | None = None, depth: int = 6) -> Iterator[str]:
    """Each CPU tensor inside ``value`` (containers, dataclasses and objects' attributes), by where it sits."""
    seen = set() if seen is None else seen
    if id(value) in seen or depth < 0 or isinstance(value, (str, bytes, int, float, bool, type(None))):
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        if not isinstance(value, OnCuda):
            yield f"{where}: {str(value.dtype).removeprefix('torch.')}{list(value.shape)} on {value.device}"
        return
    if isinstance(value, dict):
        items = ((f"{where}[{key!r}]", item) for key, item in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{where}[{index}]", item) for index, item in enumerate(value))
    elif dataclasses.is_dataclass(value) or hasattr(value, "__dict__"):
        items = ((f"{where}.{name}", item) for name, item in vars(value).items())
    else:
        return
    for place, item in items:
        yield from cpu_tensors(item, place, seen, depth - 1)


def _clear_caches() -> None:
    """Forget every model and oracle output cached in this process: the walk's live on the stand-in device."""
    for name, module in list(sys.modules.items()):
        if name.startswith("labkit"):
            for cached in vars(module).values():
                if isinstance(cached, functools._lru_cache_wrapper):
                    cached.cache_clear()
    judge._recent.clear()


def _hf_outside_inference_mode(model: LlamaModel):
    """transformers' model of ``model``, built outside inference mode: inside it, torch cannot copy the checkpoint
    into the parameters while a Python dispatch mode (the stand-in) runs every operation; a real GPU can."""
    with torch.inference_mode(False):
        return _HF(model)


_HF = LlamaModel.hf.fget  # type: ignore[attr-defined]


def _smaller(lab: str) -> contextlib.ExitStack:
    """:data:`SMALLER`'s sizes in place for ``lab``'s modules (a dict in place, so every module that imported it
    sees the new one)."""
    stack = contextlib.ExitStack()
    for name, sizes in SMALLER.items():
        if name == f"labkit.labs.{lab}" or name.startswith(f"labkit.labs.{lab}."):  # lab1's, not lab10's
            module = importlib.import_module(name)
            for key, value in sizes.items():
                if isinstance(value, dict):
                    stack.enter_context(mock.patch.dict(getattr(module, key), value))
                else:
                    stack.enter_context(mock.patch.object(module, key, value))
    return stack


def walk(lab: str, only: Collection[str] | None = None) -> list[str]:
    """Each exercise of ``lab`` (or those ``only`` names) checked on the stand-in CUDA device with the course's
    answers: what went wrong."""
    problems: list[str] = []
    _clear_caches()
    try:
        with (
            stand_in_cuda() as seen,
            mock.patch.object(LlamaModel, "hf", property(_hf_outside_inference_mode)),
            _smaller(lab),
        ):
            seen.context = f"{lab}'s notebook setup"
            namespace = solved_namespace(lab)
            for exercise in checks.exercises_for_lab(lab):
                if only is not None and exercise.id not in only:
                    continue
                seen.context = f"{lab}, exercise {exercise.id}"
                problems += [
                    f"{seen.context}: make_inputs hands the learner a CPU tensor, {place}"
                    for place in cpu_tensors(exercise.make_inputs(0), "inputs")
                ][:3]
                if exercise.id in NOT_RUN:
                    continue
                try:
                    result = evaluate(exercise.id, namespace=namespace, seed=0)
                except StandInCudaError:
                    continue  # a mismatch, said with where it happened
                except Exception as error:  # the oracle's side raised
                    problems.append(f"{seen.context}: the check raised {type(error).__name__}: {error}")
                    continue
                if not result.passed:
                    problems.append(f"{seen.context}: the course's answer did not pass: {result.message}")
            problems[:0] = [str(mismatch) for mismatch in seen.mismatches]
    finally:
        _clear_caches()
    return problems


@pytest.mark.parametrize("lab", [pytest.param(name, marks=getattr(pytest.mark, name)) for name in WALKED])
def test_every_check_puts_its_tensors_on_labkits_device(lab):
    problems = walk(lab)
    assert not problems, "\n".join(problems)


@pytest.mark.lab5
def test_the_walk_names_a_cpu_tensor_a_check_hands_the_learner(monkeypatch):
    import labkit.labs.lab5.paged_attention

    # lab 5's attention cases stay on the CPU
    monkeypatch.setattr(labkit.labs.lab5.paged_attention, "on_check_device", lambda value: value)
    problems = walk("lab5", only={"lab5.paged_attention"})  # the exercise whose inputs stay behind
    assert problems[0].startswith(
        "lab5, exercise lab5.paged_attention: make_inputs hands the learner a CPU tensor, inputs['cases'][0]['q']: "
        "float32[1, 4, 8] on cpu"
    ), problems


@pytest.mark.lab5
def test_the_walk_names_a_cpu_tensor_that_meets_cuda_ones_in_the_engine(monkeypatch):
    import labkit.kv.paged_batch

    real_mask = labkit.kv.paged_batch.causal_mask
    monkeypatch.setattr(labkit.kv.paged_batch, "causal_mask", lambda queries, keys, device: real_mask(queries, keys))
    problems = walk("lab5", only={"lab5.block_allocator"})  # its check runs the engine
    assert problems and all(problem.startswith("lab5, exercise lab5.") for problem in problems), problems
    assert "lab5, exercise lab5.block_allocator: aten." in problems[0], problems[0]
    assert "a CPU tensor beside cuda:0 ones (bool[" in problems[0], problems[0]
    assert "made at labkit/kv/attention.py" in problems[0], problems[0]


def test_the_stand_in_refuses_what_cuda_refuses():
    with stand_in_cuda() as seen:
        on_gpu = torch.ones(3, device="cuda")
        assert on_gpu.device == torch.device("cuda", 0) and (on_gpu * 2).sum().item() == 6
        assert (on_gpu * torch.tensor(2.0)).device.type == "cuda"  # a 0-dim CPU tensor is a scalar to CUDA too
        assert on_gpu[torch.tensor([0, 2])].tolist() == [1.0, 1.0]  # so are CPU indices
        assert on_gpu.cpu().device.type == "cpu" and on_gpu.to("cpu").device.type == "cpu"
        with pytest.raises(
            StandInCudaError, match=r"aten.add.Tensor .* got a CPU tensor beside cuda:0 ones \(float32\[3\]"
        ):
            on_gpu + torch.ones(3)
        with pytest.raises(StandInCudaError, match="drew on cuda:0 from a random generator on cpu"):
            torch.multinomial(on_gpu, 1, generator=torch.Generator())
        with pytest.raises(TypeError, match="can't convert cuda:0 device type tensor to numpy"):
            on_gpu.numpy()
        generator = torch.Generator(device="cuda")
        generator.manual_seed(0)
        assert torch.multinomial(on_gpu, 1, generator=generator).device.type == "cuda"
        assert torch.rand((), generator=generator, device=on_gpu.device).device.type == "cuda"
        with pytest.raises(StandInCudaError, match=r"rand at .* drew on cpu from a random generator on cuda:0"):
            torch.rand((), generator=generator)  # no device: a draw on the CPU, which a CUDA generator refuses
    assert len(seen.mismatches) == 3


def test_a_thread_started_on_the_stand_in_runs_on_it():
    """A server's engine loop and its clients run in threads of their own: they are held to the stand-in too."""
    outcome: list[str] = []

    def mix() -> None:
        on_gpu = torch.ones(2, device="cuda")
        outcome.append(str(on_gpu.device))
        try:
            on_gpu + torch.ones(2)
        except StandInCudaError:
            outcome.append("refused")

    with stand_in_cuda() as seen:
        thread = threading.Thread(target=mix)
        thread.start()
        thread.join()
    assert outcome == ["cuda:0", "refused"] and len(seen.mismatches) == 1


@pytest.mark.lab11
def test_a_kernel_handed_a_cpu_tensor_is_refused_and_one_handed_cuda_tensors_runs():
    generator = torch.Generator().manual_seed(0)
    q, k_pool, v_pool = (
        torch.randn(shape, generator=generator) for shape in ((1, 2, 16), (2, 16, 1, 16), (2, 16, 1, 16))
    )
    tables, lengths = torch.tensor([[1, 0]], dtype=torch.int32), torch.tensor([20], dtype=torch.int32)
    expected = reference_decode(q, k_pool, v_pool, tables, lengths)
    with stand_in_cuda() as seen:
        on_gpu = [tensor.to(CUDA) for tensor in (q, k_pool, v_pool, tables, lengths)]
        out = launch_paged_decode(paged_decode_kernel, *on_gpu)
        assert out.device.type == "cuda" and torch.allclose(out.cpu(), expected, atol=1e-5)
        with pytest.raises(StandInCudaError, match=r"the Triton kernel paged_decode_kernel .* \(int32\[1\] made at"):
            launch_paged_decode(paged_decode_kernel, *on_gpu[:4], lengths)  # the context lengths left on the CPU
    assert len(seen.mismatches) == 1


@pytest.mark.lab8
def test_a_rule_that_draws_on_the_cpu_from_the_cuda_generator_fails_named():
    """Lab 8's answer as it was: torch.rand without device= raises on a GPU, where the engine and the check hand
    the rule a CUDA generator; on the stand-in it fails too, and the check says what to write."""
    drawn_on_the_cpu = solved("lab8", "accept_sampling", ((", device=target_probs.device", ""),))
    _clear_caches()
    try:
        with stand_in_cuda() as seen:
            result = evaluate("lab8.accept_sampling", drawn_on_the_cpu)
    finally:
        _clear_caches()
    assert not result.passed and "device=target_probs.device" in result.message, result.message
    assert seen.mismatches and "drew on cpu from a random generator on cuda:0" in str(seen.mismatches[0]), (
        seen.mismatches
    )


def _engine_tokens(device) -> list[list[int]]:
    """A few requests through the engine on the tiny model: chunked prefill, prefix caching, an fp8 KV pool,
    greedy and sampled decoding with every logits processor, n answers per prompt, n-gram speculation."""
    model = tiny_model("llama", seed=0, device=device)
    sampled = SamplingParams(
        max_tokens=6, temperature=0.8, top_p=0.9, top_k=50, min_p=0.01, seed=3, ignore_eos=True, n=2,
        presence_penalty=0.5, frequency_penalty=0.5, repetition_penalty=1.2, logit_bias={7: 2.0}, logprobs=2,
    )  # fmt: skip
    greedy = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [5, 6, 7, 8, 9, 10, 40, 41], [9, 8, 9, 8, 9, 8]]
    plain_sampled = SamplingParams(max_tokens=6, temperature=0.8, seed=4, ignore_eos=True)
    tokens = []
    for engine_args, first in (
        (dict(max_num_batched_tokens=8, kv_cache_dtype="fp8"), sampled),
        (dict(speculative_config={"method": "ngram", "num_speculative_tokens": 2}), plain_sampled),
    ):
        llm = LLM(model, num_blocks=40, block_size=4, max_model_len=64, **engine_args)
        for output in llm.generate(prompts, [first, greedy, greedy], use_tqdm=False):
            tokens += [list(answer.token_ids) for answer in output.outputs]
    return tokens


def test_the_engines_step_keeps_its_tensors_on_the_models_device():
    on_cpu = _engine_tokens("cpu")
    with stand_in_cuda() as seen:
        on_cuda = _engine_tokens(torch.device("cuda", 0))
    assert not seen.mismatches, "\n".join(map(str, seen.mismatches))
    assert on_cuda == on_cpu  # the stand-in runs the same numbers; only the device is pretended
