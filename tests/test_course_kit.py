"""The downloaded kit (course.zip) keeps its README's promises: every file it names is in it, every command runs.

Why: a reader who unzips the kit has no tests, no solved notebooks and no CI; a README that promised them
(as the repository's does) would send the reader to commands that fail. The archive is built here the way
the book's extension builds it (book/_ext/course_download.write_archive), without building the book.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MADE_BY_MAKE = (".venv", "_build", "~/")  # what `make` creates: named in the README, not shipped
# `labkit ARGS` on the kit's own labkit package, not the one this checkout installed
RUN_THE_KITS_LABKIT = (
    "import sys, labkit; from labkit.cli import main; "
    "assert labkit.__file__.startswith(sys.argv[1]), labkit.__file__; sys.exit(main(sys.argv[2:]))"
)


def course_download():
    """book/_ext/course_download.py as a module (it is a Sphinx extension, not part of labkit)."""
    spec = importlib.util.spec_from_file_location("course_download", REPO / "book/_ext/course_download.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def kit(tmp_path_factory) -> Path:
    """The kit, unzipped into a fresh folder: what a reader has after downloading it."""
    module = course_download()
    folder = tmp_path_factory.mktemp("kit")
    archive = module.write_archive(folder)
    with zipfile.ZipFile(archive) as zipped:
        zipped.extractall(folder / "unzipped")
    return folder / "unzipped" / module.FOLDER


def readme_code(kit: Path) -> list[str]:
    """The command lines of the README's code blocks, comments dropped."""
    blocks = re.findall(r"```bash\n(.*?)```", (kit / "README.md").read_text(encoding="utf-8"), re.S)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines() if line.split("#")[0].strip()]


def test_the_readme_is_the_kits_own(kit: Path) -> None:
    text = (kit / "README.md").read_text(encoding="utf-8")
    assert "learner's kit" in text
    for absent in ("make test", "tests/", ".ci/run", "labs/source", "solved notebooks in"):
        assert absent not in text, f"the kit's README names {absent!r}, which the kit does not hold"
    assert not (kit / "tests").exists() and not (kit / "labs" / "source").exists()


def test_every_path_the_readme_names_is_in_the_kit(kit: Path) -> None:
    text = (kit / "README.md").read_text(encoding="utf-8")
    named = [
        token
        for token in re.findall(r"`([^`\s]+)`", text)
        if re.fullmatch(r"[\w.~/-]+", token) and ("/" in token or re.search(r"\.\w+$", token))
    ]
    assert "labs/lab1_prefill_decode.ipynb" in named
    missing = [path for path in named if not path.startswith(MADE_BY_MAKE) and not (kit / path).exists()]
    assert not missing, f"the kit's README names files the kit lacks: {missing}"


def test_every_make_target_the_readme_names_dry_runs(kit: Path) -> None:
    """`make -n`: each target exists and its recipe expands, from a clean unzip, without running it."""
    commands = readme_code(kit)
    targets = [
        command.split()[1] if len(command.split()) > 1 else "all" for command in commands if command.startswith("make")
    ]
    assert "all" in targets and "labs" in targets
    for target in targets + ["setup"]:
        dry = subprocess.run(["make", "-n", target], cwd=kit, capture_output=True, text=True, timeout=60)
        assert dry.returncode == 0, f"make -n {target} in the kit: {dry.stderr}"


def test_the_kits_code_is_well_formed(kit: Path) -> None:
    """Every shell script parses (bash -n), every Python file of labkit and scripts compiles."""
    for script in sorted((kit / "scripts").glob("*.sh")):
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0, script
    sources = [str(p) for folder in ("labkit", "scripts") for p in sorted((kit / folder).rglob("*.py"))]
    compiled = subprocess.run(
        [sys.executable, "-c", "import sys, ast; [ast.parse(open(f).read(), f) for f in sys.argv[1:]]", *sources],
        capture_output=True,
        text=True,
    )
    assert compiled.returncode == 0, compiled.stderr


def test_the_readmes_labkit_commands_run_from_the_kit(kit: Path) -> None:
    """The README's `labkit plan` runs on the kit's own labkit (no torch, seconds); `labkit info` needs the
    setup's torch and model, which `make` provides: it is only checked to be a labkit command."""
    labkit_commands = [command.split()[1:] for command in readme_code(kit) if command.startswith(".venv/bin/labkit")]
    assert ["info"] in labkit_commands
    for argv in labkit_commands:
        if argv[0] == "info":
            continue
        run = subprocess.run(
            [sys.executable, "-c", RUN_THE_KITS_LABKIT, str(kit), *argv],
            cwd=kit,
            env={**os.environ, "PYTHONPATH": str(kit)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, f"labkit {' '.join(argv)} in the kit: {run.stderr[-500:]}"
        assert "Capacity plan" in run.stdout
