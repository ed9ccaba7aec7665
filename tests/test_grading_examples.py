"""The example CI workflow and Slurm script grade in shards and merge with command lines labkit accepts.

Their `labkit grade` lines are parsed by labkit's own command line (`labkit.cli.main`, with the
grading itself swapped for a recorder), so an option renamed or removed in the CLI fails here
before it fails an instructor's class. The shards they cut must add up (K runs over 1..N) and the
merge must read exactly the folders the shards write.
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from pathlib import Path

import pytest

import labkit.grading.grade
from labkit.cli import main
from labkit.grading.shards import parse_shard

yaml = pytest.importorskip("yaml")

EXAMPLES = Path(__file__).resolve().parents[1] / "labkit" / "grading" / "examples"
WORKFLOW = EXAMPLES / "grade-class-matrix.yml"
SLURM = EXAMPLES / "grade-class-slurm.sh"


def logical_lines(script: str) -> list[str]:
    """A shell script's lines, with backslash continuations joined and surrounding blanks dropped."""
    return [line.strip() for line in re.sub(r"\\\n\s*", " ", script).splitlines()]


def grade_lines(script: str) -> list[str]:
    return [line for line in logical_lines(script) if line.startswith("labkit grade")]


def substituted(line: str, values: dict[str, str]) -> str:
    """`line` with GitHub's ${{ x.y }} and the shell's $NAME / ${NAME} replaced; an unknown name fails."""

    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2) or match.group(3)
        assert name in values, f"{name} in {line!r} is not defined"
        return values[name]

    return re.sub(r"\$\{\{\s*([\w.]+)\s*\}\}|\$\{(\w+)\}|\$(\w+)", value, line)


def parsed(line: str):
    """The arguments `labkit` parses from `line` (which starts with `labkit`), nothing graded."""
    seen = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(labkit.grading.grade, "run", lambda args: seen.append(args) or 0)
        try:
            assert main(shlex.split(line)[1:]) == 0
        except SystemExit as exit:
            pytest.fail(f"labkit's parser refuses {line!r} (exit {exit.code})")
    return seen[0]


def check_shards_and_merge(grades: list, merges: list, count: int) -> tuple[str, list[str]]:
    """The shard commands cover 1..count once each and there is one merge; its folder pattern, the shards' folders."""
    assert sorted(parse_shard(args.shard).index for args in grades) == list(range(1, count + 1))
    assert {parse_shard(args.shard).count for args in grades} == {count}
    (merge,) = merges
    assert merge.submissions[0] == Path("merge") and len(merge.submissions) == 2
    pattern = str(merge.submissions[1])
    return pattern, [str(args.out) for args in grades]


@pytest.fixture(scope="module")
def workflow():
    return yaml.safe_load(WORKFLOW.read_text())


def test_the_workflow_is_a_shard_matrix_and_a_merge_that_waits_for_it(workflow):
    jobs = workflow["jobs"]
    grade, merge = jobs["grade"], jobs["merge"]
    assert grade["strategy"]["matrix"]["shard"] == list(range(1, int(workflow["env"]["SHARDS"]) + 1))
    assert grade["strategy"]["fail-fast"] is False
    assert "grade" in ([merge["needs"]] if isinstance(merge["needs"], str) else merge["needs"])
    uses = [step.get("uses", "") for step in grade["steps"]]
    assert any(use.startswith("actions/cache@") for use in uses)
    assert any(use.startswith("actions/upload-artifact@") for use in uses)
    assert any(use.startswith("actions/download-artifact@") for use in (s.get("uses", "") for s in merge["steps"]))
    assert "apt-get install -y bubblewrap" in " ".join(step.get("run", "") for step in grade["steps"])
    cache = next(step for step in grade["steps"] if step.get("uses", "").startswith("actions/cache@"))
    assert cache["with"]["path"] == "~/.cache/labkit"  # labkit.cache.cache_root() on the runner


def test_the_workflow_commands_parse_and_add_up(workflow):
    env = {key: str(value) for key, value in workflow["env"].items()}
    grade_steps = workflow["jobs"]["grade"]["steps"]
    lines = [line for step in grade_steps for line in grade_lines(step.get("run", ""))]
    assert len(lines) == 1
    shards = workflow["jobs"]["grade"]["strategy"]["matrix"]["shard"]
    grades = [parsed(substituted(lines[0], {**env, "matrix.shard": str(k)})) for k in shards]
    assert all(args.lab == env["LAB"] and args.jobs >= 1 for args in grades)
    merge_lines = [line for step in workflow["jobs"]["merge"]["steps"] for line in grade_lines(step.get("run", ""))]
    merges = [parsed(substituted(line, env)) for line in merge_lines]
    pattern, outs = check_shards_and_merge(grades, merges, len(shards))
    # Each shard's folder is uploaded under its own name and downloaded to shards/NAME/.
    upload = next(s for s in grade_steps if s.get("uses", "").startswith("actions/upload-artifact@"))
    download = next(s for s in workflow["jobs"]["merge"]["steps"] if s.get("uses", "").startswith("actions/download"))
    for k, out in zip(shards, outs):
        name = substituted(upload["with"]["name"], {"matrix.shard": str(k)})
        assert substituted(upload["with"]["path"], {"matrix.shard": str(k)}).rstrip("/") == out == name
        assert fnmatch.fnmatch(name, download["with"]["pattern"])
        assert fnmatch.fnmatch(f"{download['with']['path']}/{name}", pattern)


def test_the_slurm_script_commands_parse_and_add_up():
    script = SLURM.read_text()
    defaults = dict(re.findall(r"^(\w+)=\$\{\1:-([^}]*)\}", script, re.MULTILINE))
    assert {"LAB", "SHARDS", "SUBMISSIONS", "OUT", "JOBS"} <= set(defaults)
    count = int(defaults["SHARDS"])
    assert '--array="1-$SHARDS"' in script and '--dependency="afterok:$array"' in script
    shard_line, merge_line = grade_lines(script)
    grades = [parsed(substituted(shard_line, {**defaults, "SLURM_ARRAY_TASK_ID": str(k)})) for k in range(1, count + 1)]
    merges = [parsed(substituted(merge_line, defaults))]
    pattern, outs = check_shards_and_merge(grades, merges, count)
    assert all(fnmatch.fnmatch(out, pattern) for out in outs)
    assert not fnmatch.fnmatch(str(merges[0].out), pattern)  # the merged folder is not taken for a shard


def test_a_command_line_the_cli_does_not_know_fails_here():
    with pytest.raises(pytest.fail.Exception, match="refuses"):
        parsed("labkit grade subs/a.ipynb --out grades --shards 1/4")
