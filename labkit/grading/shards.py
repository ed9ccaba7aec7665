"""Grade a class on several machines in shards, then merge their reports into exactly what one run writes.

A submission's shard follows from a stable hash of its report name (its file name), so a re-run,
or a late submission, lands in the same shard whatever else was handed in. Every run writes
run.json (labkit's version, the settings that decide grades, its shard, the class it was cut from
and the submissions it graded), covered by checksums.json. `merge_shards` trusts nothing it has
not verified: a shard missing, given twice, altered after its run, from another lab, another
labkit or other settings, and a submission graded in two shards or in none, each stop the merge
with an error that names it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import labkit
from labkit.grading.grader import GradeSettings
from labkit.grading.reports import (
    CHECKSUMS_FILE,
    RUN_FILE,
    grade_from_dict,
    sha256_of,
    similarity_flags,
    write_checksums,
    write_grades_csv,
    write_json,
)
from labkit.grading.similarity import merged_similarity
from labkit.grading.similarity_page import write_similarity

REPORT_SUFFIXES = (".json", ".xml", ".md")


class MergeError(ValueError):
    """Shard reports that cannot be merged into a trustworthy whole (the message names the shard and the fix)."""


@dataclass(frozen=True)
class Shard:
    """Shard `index` of `count` (1-based, as `--shard 2/3` writes it)."""

    index: int = 1
    count: int = 1

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def parse_shard(text: str) -> Shard:
    """`"2/3"` -> Shard(2, 3), or a ValueError saying how to write it."""
    index, slash, count = text.partition("/")
    if slash and index.isdigit() and count.isdigit() and 1 <= int(index) <= int(count):
        return Shard(int(index), int(count))
    raise ValueError(f"--shard {text}: write K/N with 1 <= K <= N, e.g. --shard 2/3 for the second of three shards")


def shard_of(name: str, count: int) -> int:
    """The shard (1..count) a submission belongs to: a hash of its name, the same on every machine and run."""
    return 1 + int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big") % count


def run_info(
    settings: GradeSettings, seed: int | None, shard: Shard, class_names: Sequence[str], graded: Sequence[str]
) -> dict[str, Any]:
    """What run.json records: shards merge only if everything but `shard` and `graded` agrees."""
    return {
        "labkit_version": labkit.__version__,
        "settings": {**asdict(settings), "seed": seed},
        "shard": str(shard),
        "class": list(class_names),
        "graded": list(graded),
    }


@dataclass(frozen=True)
class ShardReport:
    """One verified shard folder: its run.json, and the digest of its checksums.json."""

    folder: Path
    run: dict[str, Any]
    digest: str

    @property
    def shard(self) -> Shard:
        return parse_shard(self.run["shard"])

    def describe(self) -> str:
        return f"shard {self.run['shard']} ({self.folder})"


def read_shard(folder: Path) -> ShardReport:
    """A shard's folder, every file its checksums.json lists verified, and its run.json read."""
    manifest = folder / CHECKSUMS_FILE
    if not manifest.is_file():
        raise MergeError(
            f"{folder} has no {CHECKSUMS_FILE}: it is not the output of a finished `labkit grade` run "
            "(did the shard's job fail?); re-run that shard"
        )
    try:
        listed = json.loads(manifest.read_text())["files"]
    except (ValueError, KeyError, TypeError):
        raise MergeError(f"{manifest} is not a labkit checksums file; re-run that shard") from None
    for name, digest in listed.items():
        path = folder / name
        if not path.is_file() or sha256_of(path) != digest:
            raise MergeError(
                f"{path} is missing or was changed after the run (its SHA-256 no longer matches {manifest}); "
                "re-run that shard rather than edit its reports"
            )
    if RUN_FILE not in listed:
        raise MergeError(f"{folder} has no {RUN_FILE}: it was written by an older labkit; re-run it with this one")
    run = json.loads((folder / RUN_FILE).read_text())
    for name in run["graded"]:
        unlisted = [name + suffix for suffix in REPORT_SUFFIXES if name + suffix not in listed]
        if unlisted:
            raise MergeError(f"{folder}: the reports {', '.join(unlisted)} are not in {CHECKSUMS_FILE}; re-run it")
    return ShardReport(folder, run, sha256_of(manifest))


def _check_same_run(shards: Sequence[ShardReport]) -> None:
    first = shards[0]
    for shard in shards[1:]:
        for key, what in (("labkit_version", "labkit version"), ("settings", "lab and settings")):
            if shard.run[key] != first.run[key]:
                raise MergeError(
                    f"{shard.describe()} was graded with another {what} than {first.describe()} "
                    f"({shard.run[key]} against {first.run[key]}); grade every shard with the same command"
                )


def _check_every_shard_once(shards: Sequence[ShardReport]) -> None:
    counts = {shard.shard.count for shard in shards}
    if len(counts) > 1:
        raise MergeError(f"the shards were cut {' and '.join(map(str, sorted(counts)))} ways; merge one run's shards")
    count = counts.pop()
    seen: dict[int, ShardReport] = {}
    for shard in shards:
        if shard.shard.index in seen:
            raise MergeError(f"shard {shard.shard} is given twice: {seen[shard.shard.index].folder} and {shard.folder}")
        seen[shard.shard.index] = shard
    missing = [f"{index}/{count}" for index in range(1, count + 1) if index not in seen]
    if missing:
        several = len(missing) > 1
        raise MergeError(
            f"{'shards' if several else 'shard'} {', '.join(missing)} {'are' if several else 'is'} missing: "
            f"grade {'each' if several else 'it'} (--shard {missing[0]}) and merge again"
        )


def _graded_by(shards: Sequence[ShardReport]) -> dict[str, ShardReport]:
    """Each submission -> the one shard that graded it, checking it belongs there and nowhere else."""
    graded: dict[str, ShardReport] = {}
    for shard in shards:
        for name in shard.run["graded"]:
            if name in graded:
                raise MergeError(
                    f"submission {name} appears in two shards, {graded[name].describe()} and {shard.describe()}: "
                    "each must be graded once; re-run both with the same submissions"
                )
            if shard_of(name, shard.shard.count) != shard.shard.index:
                raise MergeError(
                    f"submission {name} was graded in {shard.describe()} but belongs to shard "
                    f"{shard_of(name, shard.shard.count)}/{shard.shard.count}; re-run the shards with the same command"
                )
            graded[name] = shard
    for shard in shards:
        for name in shard.run["class"]:
            if name not in graded:
                home = f"{shard_of(name, shard.shard.count)}/{shard.shard.count}"
                raise MergeError(
                    f"submission {name} (handed to {shard.describe()}) was graded by no shard: "
                    f"re-run shard {home} with it"
                )
    return graded


def merge_shards(folders: Sequence[Path], out_dir: Path) -> tuple[Path, str]:
    """Verify the shards and write the reports one run over the whole class writes; return checksums.json
    and its digest."""
    if out_dir.resolve() in {folder.resolve() for folder in folders}:
        raise MergeError(f"--out {out_dir} is one of the shards: merge into a folder of its own")
    shards = [read_shard(folder) for folder in folders]
    _check_same_run(shards)
    _check_every_shard_once(shards)
    graded = _graded_by(shards)
    order = list(dict.fromkeys(name for shard in shards for name in shard.run["class"]))
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name in order:
        for suffix in REPORT_SUFFIXES:
            written.append(Path(shutil.copyfile(graded[name].folder / f"{name}{suffix}", out_dir / f"{name}{suffix}")))
    grades = [grade_from_dict(json.loads((out_dir / f"{name}.json").read_text())) for name in order]
    similarity = merged_similarity([shard.folder for shard in shards])  # over the whole class, from the shards' cells
    written.append(write_grades_csv(grades, out_dir / "grades.csv", similarity_flags(similarity)))
    if similarity is not None:
        written += write_similarity(similarity, out_dir)
    run = {**shards[0].run, "shard": str(Shard()), "class": order, "graded": order}
    run["merged_from"] = [{"shard": shard.run["shard"], "checksums_sha256": shard.digest} for shard in shards]
    written.append(write_json(run, out_dir / RUN_FILE))
    return write_checksums(written, out_dir)
