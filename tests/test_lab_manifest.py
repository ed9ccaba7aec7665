"""Every list of labs agrees with labkit/labs/manifest.py, so a lab left out of one fails here, not silently.

The lists built from the manifest (the pytest markers, the tests that grade and execute every lab) cannot miss
a lab; the ones people write (the notebooks on disk, each lab's package and test file, the labs README's table,
the book's table of contents) are checked against it.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import nbformat
import pytest

from labkit.grading.checks import exercises_for_lab
from labkit.labs import manifest
from labkit.labs.manifest import LABS

ROOT = Path(__file__).resolve().parents[1]


def test_the_manifest_numbers_its_labs_one_to_n_once_each():
    assert [lab.number for lab in LABS] == list(range(1, len(LABS) + 1))
    assert all(lab.stem.startswith(f"{lab.name}_") for lab in LABS), [lab.stem for lab in LABS]


def test_every_notebook_on_disk_is_in_the_manifest_and_every_entry_has_both_notebooks():
    for folder in (ROOT / "labs", ROOT / "labs" / "source"):
        on_disk = {path.stem for path in folder.glob("lab*.ipynb")}
        assert on_disk == {lab.stem for lab in LABS}, f"{folder.relative_to(ROOT)}: notebooks != manifest entries"


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_each_lab_is_a_package_whose_exercises_are_the_ones_its_notebook_checks(lab):
    module = importlib.import_module(lab.module)
    assert Path(module.__file__).name == "__init__.py", f"{lab.module} must be a package: labkit/labs/{lab.name}/"
    registered = {exercise.id for exercise in exercises_for_lab(lab.name)}
    cells = nbformat.read(ROOT / "labs" / "source" / lab.notebook, as_version=4).cells
    tags = [tag for cell in cells for tag in cell.metadata.get("tags", [])]
    checked = {tag.removeprefix("check:") for tag in tags if tag.startswith("check:")}
    assert registered and registered == checked, (
        f"{lab.name}: registered {sorted(registered)}, checked {sorted(checked)}"
    )


@pytest.mark.parametrize("lab", LABS, ids=lambda lab: lab.name)
def test_each_lab_has_a_test_file_of_its_own_marked_with_it(lab):
    mark = re.compile(rf"pytest\.mark\.{lab.name}\b")
    own = [path.name for path in ROOT.glob("tests/test_*.py") if mark.search(path.read_text())]
    assert own, f"no test file marks its tests with pytest.mark.{lab.name}: add tests/test_{lab.name}_checks.py"


@pytest.mark.parametrize("lab", [lab for lab in LABS if not lab.needs_model], ids=lambda lab: lab.name)
def test_a_lab_said_to_need_no_model_never_loads_it_in_its_checks(lab):
    package = ROOT / "labkit" / "labs" / lab.name
    users = [path.name for path in package.glob("*.py") if "course_model" in path.read_text()]
    assert not users, f"{lab.name} loads the course model in {users}: set needs_model=True in its manifest entry"


def test_the_labs_readme_table_lists_every_lab_in_order():
    text = (ROOT / "labs" / "README.md").read_text()
    rows = re.findall(r"^\| `(lab\d+_\w+)\.ipynb` \|", text, flags=re.MULTILINE)
    assert rows == [lab.stem for lab in LABS], "labs/README.md's table must list the manifest's labs, in order"


def test_the_books_contents_take_every_learner_notebook_in_order():
    """The table of contents lists the labs by two globs (lab1-9, then lab10 on); each manifest lab matches one."""
    toc = (ROOT / "_toc.yml").read_text()
    globs = re.findall(r"- glob: (labs/\S+)", toc)
    ordered = [path for pattern in globs for path in sorted(p.stem for p in ROOT.glob(pattern + ".ipynb"))]
    assert ordered == [lab.stem for lab in LABS]


def test_the_pytest_markers_come_from_the_manifest(pytestconfig):
    declared = {line.split(":")[0] for line in pytestconfig.getini("markers")}
    assert {lab.name for lab in LABS} <= declared
    assert "lab1:" not in (ROOT / "pyproject.toml").read_text(), "lab markers are added from the manifest, not by hand"


def test_asking_for_a_lab_that_is_not_there_names_the_ones_that_are():
    assert manifest.lab("7").stem == "lab7_prefix_caching"
    with pytest.raises(KeyError, match="no lab 'lab99'.*lab1, lab2"):
        manifest.lab("lab99")
