"""Things every lab check needs: one copy of the course model per process, and seeded prompts.

The checks run the real model as their oracle, so they and the notebook share one loaded
copy (``course_model()``) instead of paying for a second load; the grader's requests name these models
rather than copy them, and a kernel loads its own from the same cache. Inputs come from a seed so
that the notebook's check and the grader (which draws its own seed) build the same ones.
"""

from __future__ import annotations

import functools
import random

import torch
from torch.utils._pytree import tree_map_only

from labkit.device import default_device
from labkit.grading.request import sent_by_name
from labkit.models import LlamaModel, load_model, tiny_model

# Short prompts the default model continues with confidence (no near-ties in the first tokens).
PROMPTS = (
    "The capital of France is",
    "Once upon a time, there was",
    "Water boils at a temperature of",
    "The three primary colours are",
    "A week has seven days: Monday,",
    "def add(a, b):\n    return",
    "The largest planet in our solar system is",
    "Photosynthesis is the process by which plants",
    "One, two, three, four,",
    "The opposite of hot is",
)


# A chat turn whose greedy reply ends early: "Hello." then end-of-text (<|im_end|>), its 3rd token. A
# decoding check asks it for more tokens than that, so code that stops at end-of-text is seen to.
ENDS_EARLY = "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\n"


def on_check_device(value):
    """``value`` with every tensor in it (in lists, tuples and dicts) moved to labkit's device, where the course
    model and the learner's code run (a CPU tensor handed to code on a GPU fails there).

    A check draws its random inputs on the CPU, from a CPU generator, and then moves them: a seed gives the
    same numbers on every device, so the notebook's GPU and the grader's CPU build the same inputs.
    """
    device = default_device()
    return tree_map_only(torch.Tensor, lambda tensor: tensor.to(device), value)


@functools.lru_cache(maxsize=1)
def course_model() -> LlamaModel:
    """The default model in fp32 on labkit's device, loaded once per process (notebook and checks share it).

    fp32 even on a GPU: the checks compare logits with transformers' to a tolerance that 16-bit
    arithmetic would not meet, and a 135M-parameter model is small enough either way.
    """
    model = sent_by_name(load_model(dtype="float32", progress=False), course_model)
    sent_by_name(model.tokenizer, course_model, attribute="tokenizer")
    return model


@functools.lru_cache(maxsize=4)
def small_model(seed: int = 0) -> LlamaModel:
    """A tiny random-weight Llama on labkit's device, for checks that need a model's shapes but not its knowledge."""
    return sent_by_name(tiny_model("llama", seed=seed, device=default_device()), small_model, seed)


def rng(seed: int) -> random.Random:
    """A private random stream for building a check's inputs."""
    return random.Random(seed)


def pick_prompts(seed: int, count: int) -> list[list[int]]:
    """``count`` different prompts from PROMPTS, as token ids of the course model."""
    tokenizer = course_model().tokenizer
    texts = rng(seed).sample(PROMPTS, count)
    return [list(tokenizer.encode(text)) for text in texts]


def ends_early_prompt() -> list[int]:
    """The token ids of ``ENDS_EARLY``, a prompt whose greedy reply reaches end-of-text at its 3rd token."""
    return list(course_model().tokenizer.encode(ENDS_EARLY))


def torch_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed % 2**63)


def check_generator(seed: int) -> torch.Generator:
    """A seeded generator on labkit's device, for learner code that draws random numbers for tensors there
    (CUDA draws a cuda tensor's numbers from a cuda generator only, as the engine's sampling does)."""
    return torch.Generator(device=default_device()).manual_seed(seed % 2**63)


def prompt_and_steps(seed: int) -> tuple[LlamaModel, list[int], int]:
    """Inputs of the generation checks: the course model, one seeded prompt, three new tokens."""
    return course_model(), pick_prompts(seed, 1)[0], 3


def greedy_without_cache(inputs: tuple[LlamaModel, list[int], int]) -> dict:
    """The oracle of the generation checks: rerun transformers over the whole sequence per token.

    Returns the greedy tokens, the logits each was chosen from, and the prompt.
    """
    model, ids, steps = inputs
    sequence, step_logits = list(ids), []
    for _ in range(steps):
        logits = transformers_logits(model, tuple(sequence))[-1]
        step_logits.append(logits)
        sequence.append(int(logits.argmax()))
    return {"tokens": sequence[len(ids) :], "logits": step_logits, "prompt": list(ids)}


@functools.lru_cache(maxsize=16)  # lab 1 asks for its prefill prompt's thrice, and every seed for its ENDS_EARLY's
@torch.inference_mode()  # which also makes the kept tensor one that nobody can change in place
def transformers_logits(model: LlamaModel, token_ids: tuple[int, ...]) -> torch.Tensor:
    """Logits [T, V] from Hugging Face transformers' own forward pass: the oracle for one sequence."""
    return model.hf(input_ids=torch.tensor([token_ids], device=model.device)).logits[0].float()
