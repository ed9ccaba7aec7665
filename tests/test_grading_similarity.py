"""Copying is found, not blocked: the similarity report and the source scan of exercise cells (issue 55.2).

Every test but the last calls the report's builder on cells directly (no kernel); the last grades three
small notebooks of the demo lab through `labkit grade`, where the report is one of the run's files.
"""

from __future__ import annotations

import csv
import inspect
import json
import re
from pathlib import Path

import nbformat
import pytest
from script_loader import load_script

from labkit.cli import main
from labkit.grading import sandbox, similarity
from labkit.grading.answers import reference
from labkit.grading.grader import SubmissionGrade
from labkit.grading.reference_sources import lab_references, solved_notebook
from labkit.grading.reports import write_reports
from labkit.grading.result import CheckResult
from labkit.grading.similarity import (
    CLASSMATE,
    REFERENCE,
    class_similarity,
    compare_class,
    merged_similarity,
    submitted_cells,
)
from labkit.grading.similarity_page import to_html, write_similarity
from labkit.grading.source_scan import scan_cell
from labkit.grading.submissions import exercise_cell_sources, read_notebook, submission_names
from labkit.labs.manifest import LABS

HONEST = Path(__file__).parent / "fixtures" / "similarity"  # independent honest answers, one folder per exercise
GRADING = Path(__file__).parent / "fixtures" / "grading"
LABS_DIR = Path(__file__).resolve().parents[1] / "labs"


def solved_cells(lab: str) -> dict[str, str]:
    path = solved_notebook(lab)
    assert path is not None, f"no solved notebook of {lab} in labs/source"
    return exercise_cell_sources(read_notebook(path))


def pasted(exercise: str) -> str:
    """The solved notebook's cell as a learner would paste it: without the solution markers."""
    cell = solved_cells(exercise.partition(".")[0])[exercise]
    return "\n".join(line for line in cell.splitlines() if "SOLUTION" not in line)


def lab_stem(lab: str) -> str:
    return next(entry.stem for entry in LABS if entry.name == lab)


def handed_out(lab: str) -> dict[str, str]:
    return exercise_cell_sources(read_notebook(LABS_DIR / f"{lab_stem(lab)}.ipynb"))


def honest_answers(lab: str) -> dict[str, dict[str, str]]:
    """Exercise id -> {style: cell} for every exercise of `lab` in the fixtures."""
    return {
        folder.name: {path.stem: path.read_text() for path in sorted(folder.glob("*.py"))}
        for folder in sorted(HONEST.glob(f"{lab}.*"))
    }


def test_a_pasted_reference_is_flagged_with_its_names_changed_too():
    renamed = pasted("lab1.attention").replace("scores", "s").replace("weights", "w").replace("group", "g")
    labkit_own = inspect.getsource(reference("labkit.kv.prefix_cache.block_hashes"))
    labkit_own = labkit_own.replace("def block_hashes(", "def my_block_hashes(").replace("parent", "previous")
    report = compare_class(
        {
            "pasted": ("lab1", {"lab1.attention": pasted("lab1.attention")}),
            "renamed": ("lab1", {"lab1.attention": renamed}),
            "from_labkit": ("lab7", {"lab7.block_hashes": labkit_own}),
        }
    )
    flagged = {(pair.submission, pair.exercise, pair.other) for pair in report.pairs if pair.kind == REFERENCE}
    assert ("pasted", "lab1.attention", "solved notebook lab1_prefill_decode.ipynb") in flagged
    assert ("renamed", "lab1.attention", "solved notebook lab1_prefill_decode.ipynb") in flagged
    assert ("from_labkit", "lab7.block_hashes", "labkit.kv.prefix_cache.block_hashes") in flagged
    assert all(pair.score >= similarity.threshold(pair.exercise) for pair in report.pairs)
    flags = report.flags()
    assert "lab1.attention: copied reference 1.00 (solved notebook lab1_prefill_decode.ipynb)" in flags["renamed"]
    assert "lab1.attention: same as pasted 1.00" in flags["renamed"]
    assert "lab7.block_hashes: copied reference" in flags["from_labkit"]


def test_two_classmates_identical_cells_are_flagged_once_for_both():
    answers = honest_answers("lab7")["lab7.lru_free"]
    report = compare_class(
        {
            "alice": ("lab7", {"lab7.lru_free": answers["move_to_end"]}),
            "bob": ("lab7", {"lab7.lru_free": answers["move_to_end"].replace("oldest", "first")}),
            "carol": ("lab7", {"lab7.lru_free": answers["early_returns"]}),
        }
    )
    pairs = [pair for pair in report.pairs if pair.kind == CLASSMATE]
    assert [(pair.submission, pair.other, pair.score) for pair in pairs] == [("alice", "bob", 1.0)]
    assert pairs[0].spans[0] and pairs[0].spans[1]  # the matched code of each side, for the page
    flags = report.flags()
    assert flags["alice"] == "lab7.lru_free: same as bob 1.00"
    assert flags["bob"] == "lab7.lru_free: same as alice 1.00"
    assert flags["carol"] == ""


@pytest.mark.parametrize("lab", ["lab1", "lab7"])
def test_independent_honest_answers_are_not_flagged(lab):
    """Every exercise of the lab, three or four honest answers each, written apart: no pair reaches its
    threshold, against labkit's answers or each other; lab 1's one-line mask is too short to compare."""
    answers = honest_answers(lab)
    assert {exercise.id for exercise in similarity.exercises_for_lab(lab)} == set(answers)
    cells = {
        f"{exercise}/{style}": (lab, {exercise: cell})
        for exercise, styles in answers.items()
        for style, cell in styles.items()
    }
    assert all(len(styles) >= 3 for styles in answers.values())
    report = compare_class(cells)
    assert report.pairs == [] and report.findings == {}
    assert all(flag == "" for flag in report.flags().values())
    if lab == "lab1":
        assert report.too_short == {
            "lab1.causal_mask": [REFERENCE, *(f"lab1.causal_mask/{s}" for s in answers["lab1.causal_mask"])]
        }


def test_the_calibration_script_prints_each_exercise_under_its_threshold(capsys):
    load_script("similarity_calibration").main(HONEST)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[1:]]
    assert [row[0] for row in rows] == sorted(path.name for path in HONEST.iterdir())
    assert all(max(float(row[1]), float(row[2])) < float(row[-1]) for row in rows)


@pytest.mark.parametrize("lab", ["lab1", "lab7"])
def test_starter_code_alone_is_not_flagged(lab):
    cells = {name: (lab, handed_out(lab)) for name in ("alice", "bob", "carol")}
    report = compare_class(cells)
    assert report.pairs == [] and report.findings == {}
    assert all(names == [REFERENCE] for names in report.too_short.values())  # no learner cell is even listed


def test_the_page_shows_learner_text_as_text(tmp_path):
    hostile = pasted("lab7.cached_prefix").replace(
        "    blocks = []", '    blocks = []  # </pre><script>alert("x")</script> \u202eevil\u2066 \x85'
    )
    report = compare_class(
        {"alice": ("lab7", {"lab7.cached_prefix": hostile}), "bob": ("lab7", {"lab7.cached_prefix": hostile})}
    )
    assert {pair.kind for pair in report.pairs} == {CLASSMATE, REFERENCE}
    page = to_html(report)
    assert "<script" not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert not re.search("[\u202e\u2066\x85]", page)
    assert "\\u202e" in page and "\\u2066" in page and "\\x85" in page
    assert page.count("<pre>") == page.count("</pre>")  # the cell could not close its block
    write_similarity(report, tmp_path)
    assert not re.search("[\u202e\u2066\x85]", (tmp_path / "similarity.json").read_text())


def _grade(name: str, points: float) -> SubmissionGrade:
    result = CheckResult(
        points > 0, points, "PASS" if points else "FAIL", "lab7.lru_free", "pass" if points else "fail", 1.0
    )
    return SubmissionGrade(name=name, path=f"{name}.ipynb", lab="lab7", seed=1, results=[result])


def test_grades_csv_gains_a_flags_column_and_keeps_the_points(tmp_path):
    cell = honest_answers("lab7")["lab7.lru_free"]["try_except"]
    report = compare_class({"alice": ("lab7", {"lab7.lru_free": cell}), "bob": ("lab7", {"lab7.lru_free": cell})})
    grades = [_grade("alice", 1.0), _grade("bob", 0.0)]
    manifest, _ = write_reports(grades, tmp_path, similarity=report)
    with (tmp_path / "grades.csv").open() as file:
        rows = {row["submission"]: row for row in csv.DictReader(file)}
    assert rows["alice"]["flags"] == "lab7.lru_free: same as bob 1.00" and rows["alice"]["total"] == "1"
    assert rows["bob"]["flags"] == "lab7.lru_free: same as alice 1.00" and rows["bob"]["total"] == "0"
    assert {"similarity.html", "similarity.json"} <= set(json.loads(manifest.read_text())["files"])
    write_reports(grades, tmp_path / "off")  # --no-similarity: no column, no page
    assert (
        "flags" not in (tmp_path / "off" / "grades.csv").read_text()
        and not (tmp_path / "off" / "similarity.html").exists()
    )


def test_a_submission_named_like_the_report_keeps_its_own_name_apart(tmp_path):
    names = submission_names([tmp_path / "similarity.ipynb", tmp_path / "Similarity.HTML.ipynb"])
    assert names == ["similarity_submission", "Similarity.HTML_submission"]


def test_a_report_that_fails_says_why_and_fails_nothing(tmp_path, monkeypatch):
    def broken(cells, references=None):
        raise RuntimeError("no engine today")

    monkeypatch.setattr(similarity, "compare_class", broken)
    report = class_similarity([_grade("alice", 1.0)])
    assert report.problem == "RuntimeError: no engine today"
    assert report.summary() == "the similarity report could not be made: RuntimeError: no engine today"
    write_reports([_grade("alice", 1.0)], tmp_path, similarity=report)
    assert json.loads((tmp_path / "similarity.json").read_text())["problem"] == "RuntimeError: no engine today"
    assert "flags" not in (tmp_path / "grades.csv").read_text()


def test_shards_are_compared_as_one_class(tmp_path):
    cell = honest_answers("lab7")["lab7.block_hashes"]["while_loop"]
    for shard, name in (("one", "alice"), ("two", "bob")):
        write_similarity(compare_class({name: ("lab7", {"lab7.block_hashes": cell})}), tmp_path / shard)
    merged = merged_similarity([tmp_path / "one", tmp_path / "two"])
    assert [(pair.submission, pair.other) for pair in merged.pairs] == [("alice", "bob")]
    assert merged_similarity([tmp_path / "one", tmp_path / "missing"]) is None  # a shard made no report


# The source scan: (what a cell does, how its finding's `what` starts).
REACHING_AROUND = [
    ("import importlib\nimportlib.reload(attention_module)", "importlib.reload"),
    (
        "import importlib.util as u\nspec = u.spec_from_file_location('x', path)",
        "importlib.util.spec_from_file_location",
    ),
    ("from importlib import reload\nreload(m)", "from importlib import reload"),
    ("import sys\nsys.modules.pop('labkit.kv.attention')", "sys.modules"),
    ("from sys import modules as loaded", "from sys import modules"),
    ("import gc\nobjects = gc.get_objects()", "import gc"),
    ("import sys\nframe = sys._getframe(1)", "sys._getframe"),
    ("import inspect\nf = inspect.currentframe().f_back", "inspect.currentframe"),
    ("def f():\n    return g.f_back.f_globals['seed']", ".f_back"),
    ("x = frame.f_locals", ".f_locals"),
    ("code = causal_mask.__code__", ".__code__"),
    ("code = getattr(causal_mask, '__code__')", "'__code__'"),
    ("import types\ncopy = types.FunctionType(code, {})", "types.FunctionType"),
    ("import types\nc = types.CodeType(*args)", "types.CodeType"),
    ("import marshal\ncode = marshal.loads(data[16:])", "import marshal"),
    ("exec(text)", "exec"),
    ("eval('1 + 1')", "eval"),
    ("code = compile(text, 'x', 'exec')", "compile"),
    ("import sys\nsys.settrace(watch)", "sys.settrace"),
    ("import sys\nsys.setprofile(watch)", "sys.setprofile"),
    ("import sys\nsys.meta_path.insert(0, Finder())", "sys.meta_path"),
    ("import sys\nsys.addaudithook(hook)", "sys.addaudithook"),
    ("import builtins\nbuiltins.print = quiet", "import builtins"),
    ("__builtins__.len = lambda x: 0", "__builtins__"),
    ("import labkit.grading.attempt", "import labkit.grading.attempt"),
    ("from labkit.grading import attempt\nattempt.answers_blocked = nothing", "from labkit.grading import attempt"),
    ("import labkit\nlabkit.grading.attempt.answers_blocked = nothing", "labkit.grading.attempt.answers_blocked"),
    ("from labkit.labs.lab1 import course_causal_mask", "from labkit.labs.lab1 import course_causal_mask"),
    ("from labkit.labs.common.diagnose import diagnose", "from labkit.labs.common.diagnose import diagnose"),
    ("from labkit.labs.common import mistakes", "from labkit.labs.common import mistakes"),
    ("m = __import__('labkit.labs.lab12.handoff')", "__import__"),
    ("cache = ContiguousKVCache.__new__(ContiguousKVCache)", ".__new__"),
    ("%%capture\nimport gc", "import gc"),  # a cell magic's body is read as code
]


@pytest.mark.parametrize("source, what", REACHING_AROUND, ids=[what for _, what in REACHING_AROUND])
def test_the_scan_finds_what_reaches_around_a_check(source, what):
    findings = scan_cell("lab1.attention", source)
    assert any(finding.what.startswith(what) for finding in findings), findings
    assert all(finding.exercise == "lab1.attention" and finding.line >= 1 and finding.why for finding in findings)


def test_an_exercise_cell_that_calls_labkits_answer_is_flagged_however_it_was_imported():
    """What answer blocking stops in the notebook, found again should the block have been switched off."""
    notebook = read_notebook(LABS_DIR / "lab1_prefill_decode.ipynb")
    setup = next(cell for cell in notebook.cells if cell.cell_type == "code")
    setup.source += "\nfrom labkit.kv.attention import attention as ref\n"
    for cell in notebook.cells:
        tags = cell.metadata.get("tags", [])
        if "exercise:lab1.attention" in tags:
            cell.source = "def attention(q, k, v, mask):\n    return ref(q, k, v, mask)\n"
        if "exercise:lab1.causal_mask" in tags:
            cell.source = "def causal_mask(n):\n    return labkit.kv.attention.causal_mask(n, n)\n"
    findings = compare_class({"mallory": ("lab1", submitted_cells(notebook))}).findings["mallory"]
    assert [(f.exercise, f.line, f.what) for f in findings] == [
        ("lab1.causal_mask", 2, "labkit.kv.attention.causal_mask"),
        ("lab1.attention", 2, "labkit.kv.attention.attention"),
    ]
    assert all("labkit's own answer" in finding.why for finding in findings)


def test_the_scan_leaves_honest_words_alone_and_long_strings_short():
    assert scan_cell("lab1.attention", 'model.eval()\nmode = "eval"\nprint("exec", "compile", "gc")') == []
    (finding,) = scan_cell("lab1.attention", "name = 'labkit.grading." + "x" * 1000 + "'")
    assert finding.what.startswith("'labkit.grading.xxx") and len(finding.what) == 80


def test_the_scan_says_where_and_flags_for_review():
    cell = "def attention(q, k, v, mask):\n    import gc\n    return gc.get_referrers(q)\n"
    report = compare_class({"mallory": ("lab1", {"lab1.attention": cell})})
    assert [(f.line, f.what) for f in report.findings["mallory"]] == [(2, "import gc"), (3, "gc.get_referrers")]
    assert (
        report.flags()["mallory"]
        == "lab1.attention: line 2 uses import gc; lab1.attention: line 3 uses gc.get_referrers"
    )


@pytest.mark.parametrize("lab", [entry.name for entry in LABS])
def test_honest_solved_notebooks_have_no_finding(lab):
    cells = solved_cells(lab)
    assert cells and [finding for exercise, source in cells.items() for finding in scan_cell(exercise, source)] == []
    notebook = read_notebook(LABS_DIR / "source" / f"{lab_stem(lab)}.ipynb")  # its other cells too, as handed in
    assert compare_class({"solved": (lab, submitted_cells(notebook))}).findings == {}


def test_code_added_outside_the_exercise_cells_is_scanned_too():
    """The first cell that switches answer blocking off: the lines added to the handed-out notebook count."""
    notebook = read_notebook(LABS_DIR / "lab1_prefill_decode.ipynb")
    setup = next(cell for cell in notebook.cells if cell.cell_type == "code")
    setup.source += "\nimport labkit.grading.attempt as attempt\nattempt.answers_blocked = lambda *a: None\n"
    findings = compare_class({"mallory": ("lab1", submitted_cells(notebook))}).findings["mallory"]
    assert [(finding.what, finding.exercise) for finding in findings] == [
        ("import labkit.grading.attempt", "cell 2"),
        ("labkit.grading.attempt.answers_blocked", "cell 2"),
    ]


def test_every_lab_finds_its_references():
    for entry in LABS:
        found = lab_references(entry.name)
        assert found.notes == [] and found.starters, entry.name


@pytest.mark.timing  # kernels: generous timeouts, no races
def test_a_class_run_writes_the_report_beside_the_grades(tmp_path, monkeypatch):
    """Three demo notebooks: alice and bob hand in the same cells, carol her own, with a `gc` call in one."""
    solved = nbformat.read(GRADING / "source" / "demo_basics.ipynb", as_version=4)
    carol = nbformat.read(GRADING / "source" / "demo_basics.ipynb", as_version=4)
    for cell in carol.cells:
        if "exercise:demo.softmax" in cell.metadata.get("tags", []):
            cell.source = (
                "import gc\n\n\ndef softmax(x):\n    gc.collect()\n    top = x.amax(dim=-1, keepdim=True)\n"
                "    e = (x - top).exp()\n    return e / e.sum(-1, keepdim=True)\n"
            )
    paths = []
    for name, notebook in (("alice", solved), ("bob", solved), ("carol", carol)):
        paths.append(str(tmp_path / f"{name}.ipynb"))
        nbformat.write(notebook, paths[-1])
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))  # the demo lab needs no model
    out = tmp_path / "grades"
    options = ["--lab", "demo", "--cell-timeout", "30", "--total-timeout", "300", "--jobs", "3"]
    assert (
        main(["grade", *paths, "--out", str(out), *options, *(["--no-sandbox"] if sandbox.sandbox_problem() else [])])
        == 0
    )
    with (out / "grades.csv").open() as file:
        rows = {row["submission"]: row for row in csv.DictReader(file)}
    assert {name: row["total"] for name, row in rows.items()} == {"alice": "4", "bob": "4", "carol": "4"}  # untouched
    assert rows["alice"]["flags"] == "demo.softmax: same as bob 1.00"
    assert rows["bob"]["flags"] == "demo.softmax: same as alice 1.00"
    assert rows["carol"]["flags"] == "demo.softmax: line 1 uses import gc; demo.softmax: line 5 uses gc.collect"
    data = json.loads((out / "similarity.json").read_text())
    assert data["problem"] is None and set(data["too_short"]) == {"demo.add", "demo.greedy_tokens"}
    assert "alice and bob: 1.00" in (out / "similarity.html").read_text()
    assert {"similarity.html", "similarity.json"} <= set(json.loads((out / "checksums.json").read_text())["files"])
