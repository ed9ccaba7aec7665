"""`labkit make-autograder LAB --out DIR`: the bundle Gradescope builds its autograder from, for one lab.

Writes DIR/setup.sh (run once when Gradescope builds the image: bubblewrap, labkit, the model
loaded once), DIR/run_autograder (run per submission: `python -m labkit.grading.gradescope` with
this lab and these limits) and DIR/autograder.zip holding both, which is what Gradescope's
"Configure Autograder" page takes. The lab's checks come with labkit itself, so the bundle pins the
labkit to install (`--labkit-source`, default this version). `run_autograder` reads
LABKIT_GRADESCOPE_ROOT (default /autograder) and LABKIT_PYTHON (default python3), so it can be run
outside Gradescope, in a folder laid out as Gradescope lays it out.
"""

from __future__ import annotations

import argparse
import shlex
import zipfile
from pathlib import Path

import labkit
from labkit.grading.checks import exercises_for_lab

SETUP_SH = """#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu).
set -euo pipefail
apt-get update
apt-get install -y bubblewrap python3 python3-pip
python3 -m pip install torch --index-url https://download.pytorch.org/whl/cpu
python3 -m pip install {source}
python3 -m labkit.grading.gradescope --lab {lab} --warm  # the model and the oracles, loaded (and converted) once
chmod -R a+rX "${{LABKIT_CACHE:-$HOME/.cache/labkit}}" 2>/dev/null || true  # the sandboxed kernel reads the cache
"""

RUN_AUTOGRADER = """#!/usr/bin/env bash
# Gradescope runs this for each submission: grade the notebook in $ROOT/submission/ on lab {lab},
# write $ROOT/results/results.json. Written by labkit make-autograder (labkit {version}).
# -I: nothing is imported from the working folder or PYTHON* variables, only the installed labkit.
set -uo pipefail
ROOT="${{LABKIT_GRADESCOPE_ROOT:-/autograder}}"
exec "${{LABKIT_PYTHON:-python3}}" -I -m labkit.grading.gradescope --lab {lab} --root "$ROOT" {options}
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `labkit make-autograder` options."""
    parser.add_argument("lab", help="the lab to grade, e.g. lab2")
    parser.add_argument("--out", required=True, type=Path, help="folder for setup.sh, run_autograder, autograder.zip")
    parser.add_argument(
        "--labkit-source",
        default=f"labkit[labs]=={labkit.__version__}",
        help="what setup.sh pip-installs, e.g. 'labkit[labs] @ git+https://github.com/OWNER/COURSE.git@v1.0' "
        "(default: this labkit's version)",
    )
    parser.add_argument("--cell-timeout", type=float, default=60.0, help="seconds per cell and exercise (default 60)")
    parser.add_argument("--total-timeout", type=float, default=600.0, help="seconds for all cells (default 600)")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address space of the kernel, GiB (default 8)")
    parser.add_argument("--hint-penalty", type=float, default=0.0, help="as for labkit grade (default 0)")


def write_bundle(args: argparse.Namespace) -> list[Path]:
    """Write setup.sh, run_autograder and autograder.zip into args.out; return their paths."""
    exercises_for_lab(args.lab)  # an unknown lab stops here, not on Gradescope
    limits = {
        "--cell-timeout": args.cell_timeout,
        "--total-timeout": args.total_timeout,
        "--memory-gb": args.memory_gb,
        "--hint-penalty": args.hint_penalty,
    }
    if min(limits.values()) < 0 or args.cell_timeout <= 0 or args.total_timeout <= 0 or args.hint_penalty > 1:
        raise ValueError("timeouts must be positive, --memory-gb at least 0, --hint-penalty between 0 and 1")
    options = " ".join(f"{name} {value:g}" for name, value in limits.items())
    lab = shlex.quote(args.lab)
    files = {
        "setup.sh": SETUP_SH.format(source=shlex.quote(args.labkit_source), lab=lab),
        "run_autograder": RUN_AUTOGRADER.format(lab=lab, options=options, version=labkit.__version__),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in files.items():
        path = args.out / name
        path.write_text(text)
        path.chmod(0o755)
        paths.append(path)
    bundle = args.out / "autograder.zip"
    with zipfile.ZipFile(bundle, "w") as archive:
        for path in paths:
            info = zipfile.ZipInfo(path.name)
            info.external_attr = 0o100755 << 16  # executable once Gradescope unpacks it
            archive.writestr(info, path.read_text())
    return [*paths, bundle]


def run(args: argparse.Namespace) -> int:
    """Write the bundle and say where it is."""
    paths = write_bundle(args)
    print(f"Gradescope autograder for {args.lab} in {args.out}/: upload {paths[-1].name} (setup.sh, run_autograder)")
    return 0
