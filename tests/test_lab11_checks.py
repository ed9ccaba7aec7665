"""Lab 11's kernels and checks, under Triton's interpreter on the CPU (compiled on a GPU, where there is one).

labkit's kernels equal the engine's PyTorch attention and leave its tokens unchanged; the canary names a broken
interpreter; every check passes labkit's own answers and fails the typical wrong ones by name. The wrong kernels
are labkit's, with one line changed, written to a file (Triton reads a kernel's source) and imported.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import nbformat
import pytest
import torch

from labkit.engine import LLM
from labkit.grading import evaluate
from labkit.grading.checks import get_exercise
from labkit.grading.judge import verdict, with_source_rule
from labkit.grading.result import FAIL, NOT_DONE, PASS, Mismatch, Note
from labkit.grading.submissions import exercise_cell_sources
from labkit.kernels import compile_for_gpu, paged_decode, runtime
from labkit.kernels.compile_for_gpu import compiler_problem
from labkit.kernels.runtime import tl, triton
from labkit.kernels.traffic import DecodeShape, decode_bytes, gather_bytes, kernel_bytes
from labkit.kv.paged_attention import paged_attention
from labkit.kv.paged_batch import PagedBatch, SequenceSlice
from labkit.labs.lab11 import kernel_cases
from labkit.labs.lab11.kernel_cell import PRELUDE
from labkit.labs.lab11.variants import simulate
from labkit.models import tiny_model
from labkit.sampling import SamplingParams

pytestmark = [pytest.mark.lab11, pytest.mark.usefixtures("one_torch_thread")]

SOURCE = Path(paged_decode.__file__).read_text()
RIGHT = {
    "paged_decode_kernel": paged_decode.paged_decode_kernel,
    "split_kv_kernel": paged_decode.split_kv_kernel,
    "merge_splits_kernel": paged_decode.merge_splits_kernel,
}


def kernels_with(tmp_path: Path, name: str, *changes: tuple[str, str]) -> dict:
    """labkit's kernels with each ``(old, new)`` change made (every occurrence, which must exist), imported from a
    file."""
    source = SOURCE
    for old, new in changes:
        assert old in source, old
        source = source.replace(old, new)
    path = tmp_path / f"wrong_{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"wrong_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {key: getattr(module, key) for key in RIGHT}


def test_the_canary_names_a_broken_interpreter(monkeypatch):
    runtime.check_interpreter()  # this environment's is sound

    @triton.jit
    def forgets_to_add(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)

    monkeypatch.setattr(runtime, "_add_one", forgets_to_add)
    monkeypatch.setattr(runtime, "_checked", [])
    with pytest.raises(runtime.TritonUnavailableError, match=r"computed x \+ 1 wrongly.*broken, not your kernel"):
        runtime.check_interpreter()


@pytest.mark.parametrize("heads, kv_heads", [(4, 4), (6, 2), (9, 3)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_labkits_kernels_equal_the_engines_attention_on_a_decode_batch(heads, kv_heads, num_splits):
    generator = torch.Generator().manual_seed(heads + num_splits)
    block_size, head_dim, pool = 16, 16, 30
    k_pool = torch.randn(pool, block_size, kv_heads, head_dim, generator=generator)
    v_pool = torch.randn(pool, block_size, kv_heads, head_dim, generator=generator)
    tables = torch.randperm(pool, generator=generator)[:12].view(3, 4).tolist()
    lengths = [64, 33, 1]  # decodes come longest first, as the runner sends them; 33 and 1 end mid-block
    sequences = [SequenceSlice(i, 1, n, tables[i][: -(-n // block_size)]) for i, n in enumerate(lengths)]
    batch = PagedBatch.build(sequences, block_size, torch.device("cpu"), torch.float32)
    q = torch.randn(3, heads, head_dim, generator=generator)
    expected = paged_attention(0, q, k_pool, v_pool, batch)

    def split(q, k_pool, v_pool, block_tables, context_lens):
        return paged_decode.paged_decode(q, k_pool, v_pool, block_tables, context_lens, num_splits=num_splits)

    got = paged_decode.decode_attention(split)(0, q, k_pool, v_pool, batch)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_the_engine_with_labkits_kernel_gives_the_tokens_of_its_own_attention():
    model = tiny_model("llama", seed=0)
    prompts = [[3 + i, 5, 7, 11 + i] * (i + 1) for i in range(4)]  # 4 to 16 tokens: prompts and decodes in a step
    params = SamplingParams(max_tokens=4, ignore_eos=True)  # the 16-token prompt's decodes read a second block
    dials = dict(num_blocks=64, block_size=16, max_num_seqs=4)
    own = LLM(model, **dials).generate(prompts, params, use_tqdm=False)
    kernel = LLM(model, attention=paged_decode.decode_attention(), **dials).generate(prompts, params, use_tqdm=False)
    assert [o.token_ids for o in kernel] == [o.token_ids for o in own]


def test_the_kernels_refuse_shapes_they_cannot_run():
    q, pool = torch.zeros(1, 4, 12), torch.zeros(2, 16, 2, 12)
    tables, lengths = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="power of two for head_dim, got 12"):
        paged_decode.paged_decode(q, pool, pool, tables, lengths)
    pool16 = torch.zeros(2, 16, 2, 16)
    with pytest.raises(ValueError, match="multiple of the KV heads"):
        paged_decode.paged_decode(torch.zeros(1, 3, 16), pool16, pool16, tables, lengths)


def test_the_kernels_refuse_inputs_laid_out_otherwise_than_they_read_them():
    """Offsets come from the shapes alone: a strided view or a float table would be read wrong, silently."""
    q, pool = torch.zeros(1, 4, 16), torch.zeros(2, 16, 2, 16)
    tables, lengths = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    strided = torch.zeros(2, 2, 16, 16).transpose(1, 2)  # the right shape, heads and tokens swapped in memory
    with pytest.raises(ValueError, match=r"k_pool is a strided view.*k_pool.contiguous\(\)"):
        paged_decode.paged_decode(q, strided, pool, tables, lengths)
    with pytest.raises(ValueError, match="key and value pools differ"):
        paged_decode.paged_decode(q, pool, pool.half(), tables, lengths)
    with pytest.raises(ValueError, match="block_tables holds torch.float32"):
        paged_decode.paged_decode(q, pool, pool, tables.float(), lengths)
    with pytest.raises(ValueError, match="one sequence per query row"):
        paged_decode.paged_decode(torch.zeros(2, 4, 16), pool, pool, tables, lengths)


def test_a_kernel_whose_parameters_are_named_otherwise_fails_by_name(tmp_path):
    """The launchers pass every argument by name: a kernel with a renamed parameter is told which one."""
    renamed = kernels_with(tmp_path, "renamed", ("    context_lens_ptr,\n    scale,", "    lengths_ptr,\n    scale,"))
    q, pool = torch.zeros(1, 4, 16), torch.zeros(2, 16, 2, 16)
    tables, lengths = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"no parameter context_lens_ptr; nothing fills lengths_ptr.*starter cell"):
        paged_decode.launch_paged_decode(renamed["paged_decode_kernel"], q, pool, pool, tables, lengths)


# --- the checks: right answers pass -------------------------------------------------------------------


def labkit_decode_bytes(**case):
    """labkit's count from its parts (the exercise's answer, `decode_bytes`, is out of reach while it is checked)."""
    shape = DecodeShape(**case)
    return {"kernel": kernel_bytes(shape), "gather": gather_bytes(shape)[0]}


@pytest.mark.parametrize("exercise", ["lab11.paged_decode", "lab11.split_kv"])
def test_labkits_kernels_pass_the_kernel_checks(exercise):
    result = evaluate(exercise, namespace=RIGHT)
    assert result.passed, result.message


def test_labkits_byte_count_passes_and_a_blank_is_not_done():
    assert evaluate("lab11.decode_bytes", labkit_decode_bytes).passed
    handed_in = evaluate("lab11.decode_bytes", lambda **case: decode_bytes(DecodeShape(**case)))
    assert handed_in.points == 0 and "your code called labkit.kernels.traffic.decode_bytes" in handed_in.message

    def blank(**case):
        raise NotImplementedError("Exercise lab11.decode_bytes: replace this line with your code")

    assert evaluate("lab11.decode_bytes", blank).status == NOT_DONE


def test_a_blank_kernel_is_not_done_not_failed(tmp_path):
    body = SOURCE.split("    seq = tl.program_id(0)\n", 1)[1].split("\n\n\n", 1)[0]
    blank = kernels_with(
        tmp_path, "blank", (body, '    raise NotImplementedError("Exercise lab11.paged_decode: replace")')
    )
    assert evaluate("lab11.paged_decode", namespace=blank).status == NOT_DONE


# --- the checks: typical wrong kernels fail, named ------------------------------------------------------

WRONG_KERNELS = {
    "no_rescale": (
        [
            ("running_sum = running_sum * rescale +", "running_sum = running_sum +"),
            ("acc = acc * rescale[:, None] +", "acc = acc +"),
        ],
        "multiply both by exp(old_max - new_max)",
    ),
    "no_max": (
        [
            (
                "new_max = tl.maximum(running_max, tl.max(scores, axis=1))",
                "new_max = tl.zeros([GROUP_PAD], dtype=tl.float32)",
            )
        ],
        "exp(score) overflowed",
    ),
    "unmasked_tail": (
        [("visible = index * BLOCK_SIZE + slots < context_len", "visible = slots >= 0")],
        "past the context were read as tokens",
    ),
    "wrong_kv_head": (
        [("heads = kv_head * GROUP + in_group", "heads = in_group * NUM_KV_HEADS + kv_head")],
        "read the wrong KV head",
    ),
    "block_as_token": (
        [("tl.load(block_tables_ptr + seq * max_blocks_per_seq + index)", "(index + 0 * context_len)")],
        "position in the table was used as the block itself",
    ),
    "block_own_max": (
        [("new_max = tl.maximum(running_max, tl.max(scores, axis=1))", "new_max = tl.max(scores, axis=1)")],
        "that block's own max, not the running one",
    ),
    "unwritten_rows": (
        [
            (
                "tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=(in_group < GROUP)[:, None])",
                "tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=(in_group < GROUP)[:, None] & (seq == 0))",
            )
        ],
        "the kernel never wrote",
    ),
    "bf16_accumulator": (
        [
            (
                "acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)",
                "acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=v_pool_ptr.dtype.element_ty)",
            ),
            (
                "acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)",
                "acc = (acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)).to("
                "v_pool_ptr.dtype.element_ty)",
            ),
        ],
        "a sum kept in bf16",
    ),
    "store_past_the_end": (  # the padding rows of the last group land past the output's end
        [
            (
                "tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=(in_group < GROUP)[:, None])",
                "tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty))",
            )
        ],
        "stored past the end of the output",
    ),
    "sum_never_added": (  # l stays 0: a NaN that is 0/0, not an overflow
        [("running_sum = running_sum * rescale + tl.sum(weights, axis=1)", "running_sum = running_sum * rescale")],
        "so exp cannot overflow: a NaN is 0/0",
    ),
}


@pytest.mark.parametrize("name", WRONG_KERNELS)
def test_a_typical_wrong_decode_kernel_fails_with_its_mistake_named(tmp_path, name):
    changes, named = WRONG_KERNELS[name]
    result = evaluate("lab11.paged_decode", namespace=kernels_with(tmp_path, name, *changes))
    assert not result.passed and named in result.message, result.message


def test_splits_merged_without_rescaling_fail_with_the_mistake_named(tmp_path):
    wrong = kernels_with(
        tmp_path,
        "merge",
        (
            'worth = tl.where(maxes == float("-inf"), 0.0, tl.exp(maxes - overall))',
            'worth = tl.where(maxes == float("-inf"), 0.0, 1.0)',
        ),
    )
    result = evaluate("lab11.split_kv", namespace=wrong)
    assert not result.passed and "scale split s by exp(max_s - overall_max)" in result.message, result.message


@pytest.mark.parametrize(
    "change, named",
    [
        (  # exp(max_s) overflows on the large-score case
            ("tl.exp(maxes - overall))  # an empty split", "tl.exp(maxes))  # an empty split"),
            "overflow",
        ),
        (  # right only when the split count is a power of two
            ("(row * NUM_SPLITS + splits)", "(row * SPLITS_PAD + splits)"),
            "3 splits",
        ),
    ],
)
def test_a_merge_without_the_overall_max_or_striding_by_the_padded_count_fails(tmp_path, change, named):
    wrong = kernels_with(tmp_path, "merge_variant", change)
    result = evaluate("lab11.split_kv", namespace=wrong)
    assert not result.passed and named in result.message, result.message


def test_a_split_that_runs_past_the_context_fails(tmp_path):
    wrong = kernels_with(
        tmp_path,
        "past",
        (
            "last = tl.minimum(first + blocks_per_split, tl.cdiv(context_len, BLOCK_SIZE))",
            "last = first + blocks_per_split",
        ),
    )
    result = evaluate("lab11.split_kv", namespace=wrong)
    assert not result.passed and "split" in result.message, result.message


# --- the byte count -------------------------------------------------------------------------------------


def test_the_byte_counts_follow_the_two_paths_reads():
    shape = DecodeShape([40, 16], block_size=16, num_heads=4, num_kv_heads=2, head_dim=8, dtype_bytes=2)
    token = 2 * 8 * 2  # one token's keys, both KV heads
    tables = 2 * ((3 + 1) + (1 + 1)) * 4  # per sequence: 2 KV-head programs read its table entries and its length
    assert kernel_bytes(shape) == 2 * (40 + 16) * token + 2 * 4 * 8 * 2 + tables
    read, written = gather_bytes(shape)  # both padded to 3 blocks of 16
    assert written == 2 * (2 * 3 * 16 * token)
    assert read == 2 * (2 * 3 * 16 * token) * 2 + 2 * 3 * 8 + 2 * 4 * 8 * 2


def byte_count(kv_heads_read=None, whole_blocks=False, reads=2, padded=True):
    """A learner's decode_bytes, right by default, with one of the typical mistakes when asked."""

    def count(context_lens, block_size, num_heads, num_kv_heads, head_dim, dtype_bytes=2):
        heads = num_heads if kv_heads_read else num_kv_heads
        width = max(-(-n // block_size) for n in context_lens)
        kernel = gather = 0
        for n in context_lens:
            blocks = -(-n // block_size)
            tokens = blocks * block_size if whole_blocks else n
            kernel += 2 * tokens * heads * head_dim * dtype_bytes + num_heads * head_dim * dtype_bytes
            kernel += num_kv_heads * (blocks + 1) * 4
            used = width if padded else blocks
            gather += reads * 2 * used * block_size * num_kv_heads * head_dim * dtype_bytes
            gather += width * 8 + num_heads * head_dim * dtype_bytes
        return {"kernel": kernel, "gather": gather}

    return count


@pytest.mark.parametrize(
    "mistake, named",
    [
        (dict(kv_heads_read=True), "counted per query head"),
        (dict(whole_blocks=True), "counted in whole blocks"),
        (dict(reads=1), "copy was counted once"),
        (dict(padded=False), "counted without padding"),
    ],
)
def test_typical_wrong_byte_counts_fail_with_the_mistake_named(mistake, named):
    assert evaluate("lab11.decode_bytes", byte_count()).passed  # the helper itself counts right
    result = evaluate("lab11.decode_bytes", byte_count(**mistake))
    assert not result.passed and named in result.message, result.message


def test_a_byte_count_that_is_not_a_dict_is_told_what_to_return():
    result = evaluate("lab11.decode_bytes", lambda **case: 12)
    assert not result.passed and "Return a dict" in result.message, result.message


def test_achieved_bandwidth_is_bytes_over_seconds():
    from labkit.kernels.traffic import achieved_bandwidth

    assert math.isclose(achieved_bandwidth(3_350_000_000, 0.001), 3.35e12)
    with pytest.raises(ValueError, match="seconds must be positive"):
        achieved_bandwidth(1, 0)


# --- the kernel cell's source: Triton only, compiled for a GPU --------------------------------------------

NOTEBOOK = Path(__file__).resolve().parents[1] / "labs" / "source" / "lab11_the_kernel.ipynb"
CELLS = exercise_cell_sources(nbformat.read(NOTEBOOK, as_version=4))
needs_compiler = pytest.mark.skipif(bool(compiler_problem()), reason=str(compiler_problem()))


def cell_kernels(tmp_path: Path, source: str, name: str = "cell") -> dict:
    """The kernels a notebook cell defines (after the lab's first cell's imports), imported from a file."""
    path = tmp_path / f"{name}.py"
    path.write_text(PRELUDE + source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return vars(module)


@needs_compiler
@pytest.mark.parametrize("exercise", ["lab11.paged_decode", "lab11.split_kv"])
def test_the_solved_notebooks_kernels_pass_compiled_and_interpreted(tmp_path, exercise):
    source = CELLS[exercise]
    result = evaluate(exercise, namespace=cell_kernels(tmp_path, source), source=source)
    assert result.passed and "Note" not in result.message, result.message


@needs_compiler
def test_a_kernel_only_the_interpreter_runs_fails_by_name(tmp_path):
    """A `break` out of the block loop: the interpreter gives the right outputs, the compiler refuses it."""
    source = CELLS["lab11.paged_decode"].replace(
        "        running_max = new_max\n", "        running_max = new_max\n        if index > 100:\n            break\n"
    )
    result = evaluate("lab11.paged_decode", namespace=cell_kernels(tmp_path, source), source=source)
    assert not result.passed and "unsupported AST node type: Break" in result.message, result.message
    assert "a `break` out of a loop runs only in the interpreter" in result.message


RULE_BREAKERS = {
    "a plain object that answers kernel[grid] with SDPA": (
        "import torch\nclass Kernel:\n    def __getitem__(self, grid):\n        return lambda *args, **kw: "
        "torch.nn.functional.scaled_dot_product_attention\npaged_decode_kernel = Kernel()\n",
        "'class Kernel:' runs when the cell does",
    ),
    "an empty kernel whose work a pre-run hook does": (
        "@triton.jit\ndef paged_decode_kernel(out_ptr):\n    pass\n\n"
        "paged_decode_kernel.add_pre_run_hook(lambda *args, **kwargs: None)\n",
        "add_pre_run_hook",
    ),
    "torch inside the kernel": (
        "import torch\n@triton.jit\ndef paged_decode_kernel(out_ptr):\n    torch.softmax(out_ptr, 0)\n",
        "torch is Python, not Triton",
    ),
    "a launcher patched in the cell": (
        "import triton\ntriton.runtime.jit.JITFunction.run = print\n",
        "only constants may be assigned outside the kernels",
    ),
    "a Python wrapper in place of the kernel": (
        "def paged_decode_kernel(*args):\n    return None\n",
        "is not decorated with plain @triton.jit",
    ),
    "torch imported as tl": (
        "import torch as tl\n@triton.jit\ndef paged_decode_kernel(out_ptr):\n    tl.softmax(out_ptr, 0)\n",
        "tl is bound twice",
    ),
    "tl rebound inside the kernel": (
        "@triton.jit\ndef paged_decode_kernel(out_ptr):\n    tl = out_ptr\n    tl.store(out_ptr, 0.0)\n",
        "it must stay Triton's",
    ),
    "a private attribute": (
        "@triton.jit\ndef paged_decode_kernel(out_ptr):\n    x = out_ptr.__class__\n",
        "no private or special attributes",
    ),
}


@pytest.mark.parametrize("name", RULE_BREAKERS)
def test_a_cell_that_is_not_triton_only_is_refused_by_name(name):
    source, named = RULE_BREAKERS[name]
    finding = get_exercise("lab11.paged_decode").source_rule(source)
    assert isinstance(finding, Mismatch) and named in finding.difference, finding


def test_a_fake_kernel_with_right_outputs_scores_zero():
    """The outputs pass (labkit's kernels ran), but the cell holds an object, not a kernel: 0 points."""
    source, _ = RULE_BREAKERS["a plain object that answers kernel[grid] with SDPA"]
    result = evaluate("lab11.split_kv", namespace=RIGHT, source=source)
    assert result.points == 0 and "runs when the cell does" in result.message, result.message


@needs_compiler
@pytest.mark.parametrize(
    "old, new, named",
    [
        (
            'running_max = tl.zeros([GROUP_PAD], dtype=tl.float32) - float("inf")',
            'running_max = float("-inf")',
            "one that starts as a Python float",
        ),
        (".to(tl.int64)\n", "\n", "multiplies the block number it loads as a 32-bit integer"),
        ("    tl.store(out_ptr", "    if acc > 0:\n        acc = acc * 1.0\n    tl.store(out_ptr", "a Python `if`"),
    ],
)
def test_what_the_compiler_refuses_or_int32_offsets_fail_by_name(old, new, named):
    source = CELLS["lab11.paged_decode"].replace(old, new)
    assert source != CELLS["lab11.paged_decode"]
    finding = get_exercise("lab11.paged_decode").source_rule(source)
    assert isinstance(finding, Mismatch) and named in finding.hint + finding.difference, finding


def test_without_a_compiler_the_verdict_says_so_and_a_right_answer_passes(monkeypatch):
    monkeypatch.setattr(compile_for_gpu, "compiler_problem", lambda: "ptxas is missing (test)")
    finding = get_exercise("lab11.paged_decode").source_rule(CELLS["lab11.paged_decode"])
    assert isinstance(finding, Note) and "ptxas is missing" in finding.text and "interpreter only" in finding.text


@pytest.mark.parametrize("seed", range(16))
def test_a_running_max_replaced_by_the_blocks_own_is_caught_under_every_seed(seed):
    cases = kernel_cases.decode_cases(seed)
    expected = kernel_cases.expected_outputs(cases, ("max", "block_max", "rescale"))
    keys = ("q", "k_pool", "v_pool", "block_tables", "context_lens")
    got = {name: simulate(*(case[k] for k in keys), block_max=True) for name, case in cases.items()}
    mismatch = kernel_cases.compare_cases(expected, got)
    assert isinstance(mismatch, Mismatch) and "own max" in mismatch.hint, mismatch


def test_an_object_or_a_hooked_kernel_is_not_launched(tmp_path):
    """In the notebook too: a stand-in for a kernel, or a kernel whose work a pre-run hook does, is refused."""

    class Kernel:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

        def __call__(self, *args):
            return None

    result = evaluate("lab11.paged_decode", namespace={"paged_decode_kernel": Kernel()})
    assert result.points == 0 and "not a @triton.jit kernel" in result.message, result.message
    hooked = kernels_with(tmp_path, "hooked")
    hooked["paged_decode_kernel"].add_pre_run_hook(lambda *args, **kwargs: None)
    result = evaluate("lab11.paged_decode", namespace=hooked)
    assert result.points == 0 and "has pre-run hooks" in result.message, result.message


def test_a_source_rule_fails_only_what_passed_and_adds_its_note():
    """The seam the grader calls with the exercise cell's source (read as data): a broken rule fails outputs that
    passed, a note is added to a pass, and a verdict that did not pass stands as it is."""
    exercise = dataclasses.replace(
        get_exercise("lab11.decode_bytes"),
        source_rule=lambda source: Mismatch("holds a class") if "class" in source else Note("compiled: fine"),
    )
    passed, failed = verdict(exercise, PASS), verdict(exercise, FAIL, "wrong bytes")
    assert not with_source_rule(exercise, passed, "class K: pass").passed
    assert "holds a class" in with_source_rule(exercise, passed, "class K: pass").message
    assert with_source_rule(exercise, passed, "def f(): pass").message.endswith("Note: compiled: fine")
    assert with_source_rule(exercise, failed, "def f(): pass") == failed


@needs_compiler
def test_the_worked_example_and_tl_dot_in_the_exercises_compile_for_an_h100():
    """What the worked example's text says the compiler accepts, it accepts: its kernel both ways (broadcast and
    sum, tl.dot at 4 rows), and the exercises' kernels with their products written as tl.dot."""
    cells = nbformat.read(NOTEBOOK, as_version=4).cells
    example = next(cell.source for cell in cells if "def best_score_kernel" in cell.source)
    kernel = PRELUDE + example.split("\n\n\ndevice")[0]
    types = dict(out_ptr="*fp32", q_ptr="*fp32", k_ptr="*bf16", num_keys="i32")
    signature = types | dict.fromkeys(["ROWS", "ROWS_PAD", "KEYS", "DIM", "USE_DOT"], "constexpr")
    jobs = [
        compile_for_gpu.Job(
            "best_score_kernel", signature, dict(ROWS=3, ROWS_PAD=4, KEYS=16, DIM=64, USE_DOT=dot), 90, source=kernel
        )
        for dot in (False, True)
    ]
    assert [result.error for result in compile_for_gpu.compile_in_child(jobs)] == [None, None]
    products = {
        "scores = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale": "scores = tl.dot(q, tl.trans(k)) * scale",
        "acc = acc * rescale[:, None] + tl.sum(weights[:, :, None] * v[None, :, :], axis=1)": (
            "acc = acc * rescale[:, None] + tl.dot(weights, v)"
        ),
    }
    for exercise in ("lab11.paged_decode", "lab11.split_kv"):
        source = CELLS[exercise]
        for old, new in products.items():
            assert old in source
            source = source.replace(old, new)
        assert get_exercise(exercise).source_rule(source) is None
