"""The course book: its words are our own, it builds with warnings as errors, and a reader sees it whole.

Why: the book is the front door of the course. These tests build it exactly as
the README does (every chapter executed, `-W --keep-going`), then look at the
HTML a reader gets: each chapter's computed figures, its math, its folded
answers and its navigation. What a real browser renders of the same build
(MathJax typesets offline, screenshots in test-artifacts/) is
test_browser_book.py's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from labkit.labs.manifest import LABS

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from colophon import bibtex, licence_summary  # noqa: E402  (the book's own extensions)
from offline_search import searchable_text  # noqa: E402
from quiz import (  # noqa: E402
    QuizError,
    read_quiz,
    salt_of,
    scramble,
    sequence_problems,
    spread_problems,
    spread_problems_by_page,
)

REPO = Path(__file__).resolve().parents[1]
SOURCES = Path(__file__).resolve().parents[2] / "shared" / "sources"
RUN_LENGTH = 8  # no run of this many consecutive words may come from the sources
BUILD_TIMEOUT_S = 900  # against a hang only: the build takes ~150 s in CI, and went past 420 s at load 9-16


def chapter_docs() -> list[str]:
    """Book chapters (like 'book/sale') in table-of-contents order: the numbered parts' pages.

    The root, Get started, the labs and the back matter (glossary, references) are not chapters.
    """
    toc = yaml.safe_load((REPO / "_toc.yml").read_text())
    return [chapter["file"] for part in toc["parts"] if part.get("numbered") for chapter in part["chapters"]]


def repository_url() -> str:
    return yaml.safe_load((REPO / "_config.yml").read_text())["repository"]["url"]


# --- our own words ---------------------------------------------------------------------------


def words(text: str) -> list[str]:
    """Lower-case words with punctuation, quotes and markup removed, so only the wording is compared."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").lower()
    text = re.sub(r"(\w)'(\w)", r"\1\2", text)  # "don't" and "don’t" both become "dont"
    return re.findall(r"[a-z0-9]+", text)


def source_text(path: Path) -> str:
    """A source's prose: JSON sources contribute their string values, others their raw text."""
    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    strings: list[str] = []

    def collect(node: object) -> None:
        if isinstance(node, str):
            strings.append(node)
        elif isinstance(node, dict):
            for value in node.values():
                collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)

    collect(data)
    return "\n".join(strings)


def runs(tokens: list[str], length: int = RUN_LENGTH) -> set[tuple[str, ...]]:
    return {tuple(tokens[i : i + length]) for i in range(len(tokens) - length + 1)}


def page_text(path: Path) -> str:
    """A chapter's Markdown, or the text of every cell of a lab notebook."""
    if path.suffix == ".ipynb":
        return "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text(encoding="utf-8"))["cells"])
    return path.read_text(encoding="utf-8")


# How an author's notes read, not a book: sources are cited by title in the references, as any book does.
AUTHORING_NOTES = (
    "source article",
    "source lesson",
    "did not survive",
    "reconstructed them",
    "this course draws on",
    "the post's",
    "this course was written on",
    "seed 000",
    "seed 001",
    "seed 002",
    "we chose",
    "the lessons name",
    "the course was written on",
)


def test_no_authoring_notes_reach_the_reader() -> None:
    """Neither the chapters nor the figures' data (labkit's presets, shown in widgets) speak of the course's sources
    as its authors would among themselves."""
    places = sorted((REPO / "book").glob("*.md")) + sorted((REPO / "labkit" / "capacity").glob("*.py"))
    found = [
        f"{path.relative_to(REPO)}: {note!r}"
        for path in places
        for note in AUTHORING_NOTES
        if note in path.read_text(encoding="utf-8").lower()
    ]
    assert not found, "say it as a book would, citing the source by title:\n" + "\n".join(found)


# Sentences a reader once met that stated something false (issue 48), as patterns, each beside what is true instead.
FALSE_CLAIMS = {
    "never the text": "speculative decoding keeps the text only under greedy decoding; sampling keeps the distribution",
    "never changes the text": "speculative decoding keeps the text only under greedy decoding",
    "build step per model": "TensorRT-LLM's PyTorch backend loads checkpoints directly",
    r"\(not covered\)": "lab 10 and capacity planning cover models bigger than one card",
    "shown accurate when calibrated": "Vidur profiles every operator; it is not the four-constant model",
    r"\$\{fmt\(batch\.value\)\} sequences": "one sequence is singular: counted(batch.value, 'sequence')",
    "arithmetic-bound never": "'never turns arithmetic-bound'",
    "8,000-token document": "the friend's document is 8,192 tokens, as the chapter's answer and figure say",
    r"(?<![\d,])1 conversations": "'1 conversation fits'",
    # issue 59's low items
    "comes from DistServe": "the word 'goodput' is older; DistServe gave it its meaning for LLM serving",
    r"reported 2\.6 times": "Sarathi-Serve's speed-ups are 'up to' 2.6, 3.7 and 5.6 times",
    "features/spec_decode.html": "vLLM's n-gram speculation docs moved to features/speculative_decoding/n_gram/",
    r"segments? every decode step": "vLLM's Triton backend splits some decode batches (small ones), not every step",
    r"\{native,\s*disk\}": "vLLM's --kv-offloading-backend takes native or lmcache; disk is labkit's",
    "load as the bound": "llm-d's scheduler adds weighted scores for cache and load; only SGLang's router bounds",
    "with the fixed cost of every pass about": "a clause needs its verb: 'about 90 once the fixed cost is counted'",
}


def test_no_false_claim_returns() -> None:
    """The chapters, the labs and the figures' and fleet's code no longer state what a reader once found false."""
    places = sorted((REPO / "book").glob("*.md")) + sorted((REPO / "labkit" / "viz").glob("*.py"))
    places += sorted((REPO / "labs").glob("**/*.ipynb")) + [REPO / "labkit" / "engine" / "fleet.py"]
    found = [
        f"{path.relative_to(REPO)}: {claim!r} ({truth})"
        for path in places
        for claim, truth in FALSE_CLAIMS.items()
        if re.search(claim, path.read_text(encoding="utf-8"))
    ]
    assert not found, "\n".join(found)


def suggested_commands(program: str) -> list[tuple[str, list[str]]]:
    """Every complete ``labkit <program> --example ...`` command a chapter shows in inline code."""
    pattern = re.compile(rf"`labkit {program} (--example [^`]*)`")
    return [
        (path.name, ["plan", *match.group(1).split()])
        for path in sorted((REPO / "book").glob("*.md"))
        for match in pattern.finditer(path.read_text(encoding="utf-8"))
    ]


@pytest.mark.parametrize(("chapter", "argv"), suggested_commands("plan"), ids=" ".join)
def test_every_plan_command_a_chapter_suggests_runs(chapter: str, argv: list[str], capsys) -> None:
    """A command the book tells a reader to type works (chapter 8 once suggested --load with --replicas)."""
    from labkit.cli import main

    status = main(argv)
    assert status == 0, f"{chapter}: labkit {' '.join(argv)} fails: {capsys.readouterr().err}"


def test_the_book_suggests_the_fleet_commands() -> None:
    """The parametrized test above finds the chapters' commands (a changed pattern would silently find none)."""
    commands = [" ".join(argv) for _, argv in suggested_commands("plan")]
    assert "plan --example sale-70b --tensor-parallel 4 --replicas 27" in commands, commands


def test_labkit_serve_takes_every_flag_the_dial_chapter_names() -> None:
    """The dial chapter lists the vLLM flags labkit serve shares; each must be one of labkit serve's options."""
    import argparse

    from labkit.serve.serve_cli import add_arguments

    text = page_text(REPO / "book" / "the_dial.md")
    listed = re.search(r"`labkit serve` takes each of these dials.*?\((.*?)\)", text, re.DOTALL)
    assert listed, "the_dial.md no longer lists the flags labkit serve shares with vLLM"
    flags = re.findall(r"`(--[a-z-]+)`", listed.group(1))
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    known = {option for action in parser._actions for option in action.option_strings}
    assert "--kv-cache-dtype" in flags and len(flags) >= 8, flags
    assert not set(flags) - known, f"labkit serve lacks {sorted(set(flags) - known)}"


def test_no_eight_word_run_from_the_sources() -> None:
    """Neither the book nor the labs copy a run of eight words from the source lessons."""
    if not SOURCES.is_dir():
        pytest.skip(f"source lessons not found at {SOURCES} (they live beside the repository, in ../shared/sources)")
    borrowed = set()
    for source in sorted(SOURCES.glob("*.txt")):
        borrowed |= runs(words(source_text(source)))
    assert borrowed, f"no text found in {SOURCES}/*.txt"
    copied = []
    pages = sorted((REPO / "book").glob("*.md")) + sorted((REPO / "labs" / "source").glob("*.ipynb"))
    assert len(pages) > 10, "expected the book's chapters and the labs' sources"
    for page in pages:
        tokens = words(page_text(page))
        for i in range(len(tokens) - RUN_LENGTH + 1):
            if tuple(tokens[i : i + RUN_LENGTH]) in borrowed:
                copied.append(f"{page.name}: '{' '.join(tokens[i : i + RUN_LENGTH])}'")
    assert not copied, "these word runs are copied from the sources; rewrite them in your own words:\n" + "\n".join(
        copied
    )


def test_the_copy_check_catches_a_copied_sentence() -> None:
    """The checker itself: punctuation and case must not hide a copied run."""
    source = runs(words("Prefill pushes the whole prompt through the model in one parallel pass."))
    copied = words("PREFILL pushes the whole prompt, through the model -- in one go")
    assert any(run in source for run in runs(copied))
    assert not any(run in source for run in runs(words("Prefill reads every prompt token in a single pass.")))


# --- end-of-chapter checks -------------------------------------------------------------------

QUIZ_BLOCK = re.compile(r"^```\{quiz\}\n(.*?)^```", re.S | re.M)


CHECKS_PER_CHAPTER = 5
# Chapters whose ideas are numbers: each asks the reader to work some out ("compute: true", with the working).
QUANTITATIVE = ("two_numbers", "metrics", "batching", "kv_memory", "speculative_decoding", "capacity_planning")
PREDICT_BOX = re.compile(r"^:::\{admonition\} Predict first\n:class: tip\n(.*?)^:::", re.S | re.M)
SHARED_RUN = 6  # a check sharing this many consecutive words with a predict-first box repeats it


def chapter_checks(doc: str) -> list[dict]:
    """Every check on a chapter's page, in page order (the end-of-chapter ones and any in the text)."""
    return [read_quiz(block) for block in QUIZ_BLOCK.findall((REPO / f"{doc}.md").read_text(encoding="utf-8"))]


def end_of_chapter_checks(doc: str) -> list[dict]:
    text = (REPO / f"{doc}.md").read_text(encoding="utf-8")
    _, found, end = text.partition("## Check yourself\n")
    assert found, f"{doc}.md has no '## Check yourself' section at its end"
    return [read_quiz(block) for block in QUIZ_BLOCK.findall(end)]


def right_position(quiz: dict) -> int:
    return next(i for i, option in enumerate(quiz["options"]) if option.get("right"))


def spread_records(docs: list[str]) -> list[tuple[str, int, tuple[int, ...]]]:
    """What the build's spread check sees: each check's page, right position and option lengths."""
    return [
        (doc, right_position(quiz), tuple(len(option["answer"]) for option in quiz["options"]))
        for doc in docs
        for quiz in chapter_checks(doc)
    ]


@pytest.mark.parametrize("doc", chapter_docs())
def test_every_chapter_ends_with_checks_whose_options_explain_themselves(doc: str) -> None:
    checks = end_of_chapter_checks(doc)
    assert len(checks) >= CHECKS_PER_CHAPTER, (
        f"{doc}.md ends with {len(checks)} checks; practice needs at least {CHECKS_PER_CHAPTER} "
        "```{quiz} blocks under '## Check yourself' (see book/_ext/quiz.py)"
    )
    for quiz in chapter_checks(doc):
        explanations = [option["why"].strip() for option in quiz["options"]]
        assert len(set(explanations)) == len(explanations), f"{doc}: two options share one explanation"
    questions = [quiz["question"] for quiz in chapter_checks(doc)]
    assert len(set(questions)) == len(questions), f"{doc}: a check is asked twice"


@pytest.mark.parametrize("doc", [f"book/{name}" for name in QUANTITATIVE])
def test_quantitative_chapters_ask_the_reader_to_compute(doc: str) -> None:
    computed = [quiz for quiz in end_of_chapter_checks(doc) if quiz.get("compute")]
    assert len(computed) >= 2, (
        f"{doc}.md has {len(computed)} 'compute it yourself' checks; give at least two numbers to work out "
        "(`compute: true`, the working in the right option's `why:`)"
    )


def repeated_predict_boxes(doc: str) -> list[str]:
    """The chapter's checks that share a run of SHARED_RUN words with one of its own predict-first boxes."""
    boxes = PREDICT_BOX.findall((REPO / f"{doc}.md").read_text(encoding="utf-8"))
    box_runs = {run for box in boxes for run in runs(words(box), SHARED_RUN)}
    return [
        quiz["question"] for quiz in chapter_checks(doc) if box_runs & set(runs(words(quiz["question"]), SHARED_RUN))
    ]


@pytest.mark.parametrize("doc", chapter_docs())
def test_no_check_repeats_its_chapters_predict_first_box(doc: str) -> None:
    assert not repeated_predict_boxes(doc), (
        f"{doc}: these checks repeat a predict-first box: {repeated_predict_boxes(doc)}"
    )


def test_the_repeat_check_catches_a_predict_box_asked_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = "A sequence currently holds 62 tokens in blocks of sixteen. How many blocks does it own?"
    check = f"question: |\n  {box}\noptions:\n" + "".join(
        f"  - answer: {n} blocks.\n    why: Because {n}.\n" + ("    right: true\n" if n == 4 else "")
        for n in (3, 4, 62)
    )
    (tmp_path / "book").mkdir()
    page = f":::{{admonition}} Predict first\n:class: tip\n{box}\n:::\n\n## Check yourself\n\n```{{quiz}}\n{check}```\n"
    (tmp_path / "book" / "copied.md").write_text(page, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert repeated_predict_boxes("book/copied") == [box + "\n"]


def test_the_books_right_answers_give_no_position_or_length_away() -> None:
    """Over the book and within each chapter: no position, nor the longest or shortest option, right far more (or
    less) often than chance would have it; the same check the build runs (book/_ext/quiz.py)."""
    records = spread_records(chapter_docs())
    assert not spread_problems_by_page(records), spread_problems_by_page(records)


def test_clustered_right_answers_are_named() -> None:
    clustered = [(f"page{i}", 1, (10, 20, 30)) for i in range(6)]
    assert spread_problems(clustered) == [
        "option 2 is right in 6 of 6 checks, 2.0 by chance (['page0', 'page1', 'page2', 'page3', 'page4', 'page5'])"
    ]
    spread = [(f"page{i}", i % 3, (30, 20, 10) if i % 2 else (10, 30, 20)) for i in range(6)]
    assert spread_problems(spread) == []


def test_a_long_right_answer_gives_itself_away() -> None:
    long_right = [(f"page{i}", i % 3, tuple(60 if j == i % 3 else 20 for j in range(3))) for i in range(6)]
    assert spread_problems(long_right) == [
        "the right answer is the longest option in 6 of 6 checks, 2.0 by chance "
        "['page0', 'page1', 'page2', 'page3', 'page4', 'page5']"
    ]
    short_right = [(page, right, tuple(80 - length for length in lengths)) for page, right, lengths in long_right]
    assert spread_problems(short_right)[0].startswith("the right answer is the shortest option in 6 of 6")
    tied = [(page, right, (40, 40, 40)) for page, right, _ in long_right]
    assert spread_problems(tied) == [], "equal lengths tell nothing"


def test_a_position_never_right_gives_itself_away_too() -> None:
    """With enough checks, a position (or length) the right answer avoids is a hint as well: a reader skips it."""
    avoided = [(f"page{i}", i % 2, (10, 20, 30)) for i in range(24)]  # never option 3, never the longest
    assert spread_problems(avoided[:4]) == [], "four checks are too few to tell"
    assert spread_problems(avoided) == [
        "option 3 is right in 0 of 24 checks, 8.0 by chance ([])",
        "the right answer is the longest option in 0 of 24 checks, 8.0 by chance []",
    ]
    assert spread_problems(avoided + [(f"late{i}", 2, (10, 20, 30)) for i in range(12)]) == []


def test_one_chapter_clustered_is_named_even_when_the_book_is_spread() -> None:
    positions = "022012122020112002122112002021"  # no position, length or sequence a reader could follow
    spread = [(f"page{i}", int(right), (10 + i % 2, 20, 15)) for i, right in enumerate(positions)]
    assert spread_problems_by_page(spread) == []
    one_page = [("crowded", 0, (15, 10, 20))] * 5
    problems = spread_problems_by_page(spread + one_page)
    assert problems == [
        "in crowded: option 1 is right in 5 of 5 checks, 1.7 by chance "
        "(['crowded', 'crowded', 'crowded', 'crowded', 'crowded'])",
        "in crowded: the right option is the same as the previous check's in 4 of 4 checks, 1.3 by chance",
        "in crowded: the right option is the same as the one two checks back in 3 of 3 checks, 1.0 by chance",
    ]


def sphinx_build_with_checks(tmp_path: Path, right_positions: list[int]) -> subprocess.CompletedProcess:
    """A one-page Sphinx project with the book's quiz extension and one 3-option check per right position."""
    source = tmp_path / "source"
    source.mkdir(parents=True)
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\nextensions = ['quiz']\n", encoding="utf-8"
    )
    checks = []
    for number, right in enumerate(right_positions):
        options = "".join(
            f"     - answer: Answer {letter} to question {number}.\n       why: Because of {letter}.\n"
            + ("       right: true\n" if index == right else "")
            for index, letter in enumerate("abc")
        )
        checks.append(f".. quiz::\n\n   question: Question {number}?\n   options:\n{options}\n")
    (source / "index.rst").write_text("Checks\n======\n\n" + "".join(checks), encoding="utf-8")
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(source), str(tmp_path / "html")]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_the_build_stops_on_checks_whose_right_answers_cluster(tmp_path: Path) -> None:
    clustered = sphinx_build_with_checks(tmp_path / "clustered", [1, 1, 1, 1, 0])
    assert clustered.returncode != 0, "five checks, four right at option 2, built without complaint"
    assert "give themselves away" in clustered.stderr and "option 2 is right in 4 of 5" in clustered.stderr
    spread = sphinx_build_with_checks(tmp_path / "spread", [1, 1, 0, 2, 2])
    assert spread.returncode == 0, spread.stderr
    rotation = sphinx_build_with_checks(tmp_path / "rotation", [0, 1, 2, 0, 1, 2])
    assert rotation.returncode != 0, "right answers A, B, C, A, B, C built without complaint"
    assert "the option after the previous check's" in rotation.stderr


def test_right_answers_that_follow_a_pattern_are_named() -> None:
    """A reader who notices "the next letter", "the same letter again" or an A-B-A-B swing scores without reading."""
    three = (10, 20, 30)
    rotation = [(f"page{i}", i % 3, three) for i in range(9)]
    assert any("the option after the previous check's" in problem for problem in sequence_problems(rotation))
    same = [("page", 2 if i < 5 else i % 3, three) for i in range(9)]
    assert any("the same as the previous check's" in problem for problem in sequence_problems(same))
    swing = [("page", (0, 2)[i % 2], three) for i in range(9)]
    assert any("two checks back" in problem for problem in sequence_problems(swing))
    mixed = [("page", right, three) for right in (1, 1, 0, 2, 2, 0, 1, 0, 2)]
    assert sequence_problems(mixed) == []


def test_a_dollar_in_a_check_is_money_not_math(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(REPO / 'book' / '_ext')!r})\nextensions = ['quiz']\n", encoding="utf-8"
    )
    options = "".join(
        f"     - answer: ${price} per million tokens.\n       why: Because ${price} and $2.00 differ.\n"
        + ("       right: true\n" if price == "0.28" else "")
        for price in ("0.28", "2.00", "7.20")
    )
    question = "   question: A planner reports $0.28 per million tokens at $2.00 per hour. What is right?\n"
    (source / "index.rst").write_text(f"Checks\n======\n\n.. quiz::\n\n{question}   options:\n{options}\n")
    command = [sys.executable, "-m", "sphinx", "-b", "html", "-q", str(source), str(tmp_path / "html")]
    built = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert built.returncode == 0, built.stderr
    page = (tmp_path / "html" / "index.html").read_text(encoding="utf-8")
    assert "$0.28 per million tokens at $2.00 per hour" in page and 'class="math' not in page


def test_seed_lessons_check_is_a_real_check_in_the_kv_chapter() -> None:
    """The source lesson's end-of-lesson question (prefix caching) is a check with feedback on every option,
    no longer a predict-first box."""
    checks = [quiz for quiz in chapter_checks("book/kv_memory") if "2,000-token system prompt" in quiz["question"]]
    assert len(checks) == 1, "book/kv_memory.md should ask the source lesson's prefix-caching question once, as a check"
    options = checks[0]["options"]
    assert len(options) == 4 and all(option["why"].strip() for option in options)
    assert "prefix" in options[right_position(checks[0])]["answer"]
    boxes = PREDICT_BOX.findall((REPO / "book" / "kv_memory.md").read_text(encoding="utf-8"))
    assert not [box for box in boxes if "system prompt" in box], "the question is still a predict-first box too"


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ("options: []", "question"),
        ("question: Q?\noptions:\n  - {answer: a, why: w, right: true}\n  - {answer: b, why: w}", "3 or 4"),
        ("question: Q?\noptions:\n" + "  - {answer: a, why: w}\n" * 3, "exactly one option"),
        ("question: Q?\noptions:\n  - {answer: a, right: true}\n" + "  - {answer: b, why: w}\n" * 2, "option 1"),
        ("question: [unclosed", "not valid YAML"),
        ("question: Q?\noptions:\n  - {answer: 115, why: w, right: true}\n" + "  - {answer: b, why: w}\n" * 2, "quote"),
        (
            "question: Q?\ncompute: yes please\noptions:\n  - {answer: a, why: w, right: true}\n"
            + "  - {answer: b, why: w}\n" * 2,
            "true or false",
        ),
        (
            "question: Q?\ncompute: true\noptions:\n  - {answer: a, why: it is 4, right: true}\n"
            + "  - {answer: b, why: w}\n" * 2,
            "show the working",
        ),
    ],
)
def test_a_malformed_check_is_refused_with_the_fix(body: str, complaint: str) -> None:
    with pytest.raises(QuizError, match=complaint):
        read_quiz(body)


# --- the figures -------------------------------------------------------------------------------

COLUMN_PX = 688  # the text column of a 1280 px window: a wider figure is shrunk to it
SMALLEST_TEXT_PX = 9  # a label shown smaller than this is a smudge, not a word
FIGURE_CELL = re.compile(r"```\{code-cell\}[^\n]*\n(.*?)\n```", re.S)
PATH_LIKE = re.compile(r"^\S*[/.]\S*$")  # a file name or path, a URL: what docutils writes when no alt is given


def test_every_figure_cell_describes_its_figure_and_draws_svg() -> None:
    """A cell that shows a matplotlib figure carries an alt sentence (`:mystnb: {image: {alt: ...}}`), and its
    chapter turns SVG output on (labkit.viz.use_svg_figures) before the first figure."""
    problems = []
    for doc in chapter_docs():
        text = (REPO / f"{doc}.md").read_text(encoding="utf-8")
        cells = [cell for cell in FIGURE_CELL.findall(text) if "plt.show()" in cell]
        for cell in cells:
            found = re.search(r'^:mystnb: \{image: \{alt: "([^"]+)"\}\}$', cell, flags=re.M)
            if not found or len(found.group(1).split()) < 8:
                problems.append(f"{doc}: a figure cell without an alt sentence: {cell.splitlines()[-3:]}")
        if cells and "use_svg_figures()" not in text.split("plt.show()")[0]:
            problems.append(f"{doc}: no use_svg_figures() before the first figure")
    assert not problems, "\n".join(problems)


class Images(HTMLParser):
    """Every <img> of a page: its src, alt and width attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[dict[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.images.append({key: value or "" for key, value in attrs})


def css_px(length: str) -> float:
    """An SVG width ('432pt', '600px', '600') in CSS pixels."""
    number = float(re.match(r"[\d.]+", length).group())
    return number * 4 / 3 if length.endswith("pt") else number


def smallest_text_px(svg: str) -> float | None:
    """The size, in screen pixels, of the smallest text of an SVG shown at most COLUMN_PX wide; None if no text."""
    root = re.search(r"<svg\b[^>]*>", svg).group()
    width = css_px(re.search(r'\bwidth="([^"]+)"', root).group(1))
    view_box = re.search(r'\bviewBox="([^"]+)"', root)
    user_width = float(view_box.group(1).split()[2]) if view_box else width
    sizes = [float(size) for size in re.findall(r'font-size(?::\s*|=")([\d.]+)', svg)]
    sizes += [float(size) for size in re.findall(r"\bfont:\s*(?:\w+\s+)*?([\d.]+)px", svg)]
    return min(sizes) * min(width, COLUMN_PX) / user_width if sizes else None


def png_width(path: Path) -> int:
    return int.from_bytes(path.read_bytes()[16:20], "big")  # the IHDR chunk's width


def figure_problems(root: Path) -> list[str]:
    """'page: src (why)' for every picture a reader cannot use: no alt sentence, a PNG not drawn at twice the pixels
    it is shown at, or text shown smaller than SMALLEST_TEXT_PX."""
    problems = []
    for page in sorted(root.rglob("*.html")):
        if page.relative_to(root).parts[0].startswith("_"):
            continue  # Sphinx's own folders
        parsed = Images()
        parsed.feed(page.read_text(encoding="utf-8"))
        for image in parsed.images:
            src, alt = image.get("src", ""), image.get("alt", "").strip()
            where = f"{page.relative_to(root)}: {src}"
            if not alt or PATH_LIKE.match(alt) or len(alt.split()) < 5:
                problems.append(f"{where} (alt {alt!r} says nothing of what it shows)")
            file = (page.parent / src).resolve()
            if src.endswith(".svg") and file.is_file():
                smallest = smallest_text_px(file.read_text(encoding="utf-8"))
                if smallest is not None and smallest < SMALLEST_TEXT_PX:
                    problems.append(f"{where} (text shown at {smallest:.1f} px)")
            elif src.endswith(".png") and file.is_file():
                shown = min(float(image.get("width") or png_width(file)), COLUMN_PX)
                if png_width(file) < 2 * shown:
                    problems.append(f"{where} (a {png_width(file)} px PNG shown {shown:.0f} px wide: not 2x)")
            elif not file.is_file():
                problems.append(f"{where} (no such file)")
    return problems


def svg(width_pt: float, font_px: float) -> str:
    return (
        f'<svg width="{width_pt}pt" height="100pt" viewBox="0 0 {width_pt} 100" xmlns="http://www.w3.org/2000/svg">'
        f'<text style="font-size: {font_px}px; font-family: sans-serif">label</text></svg>'
    )


def test_the_figure_check_names_each_unusable_picture(tmp_path: Path) -> None:
    """A hand-made page: a good SVG, a path for an alt, a 9-inch SVG with 7-point labels, a 1x and a 2x PNG."""
    (tmp_path / "good.svg").write_text(svg(504, 9))  # 7 in: shown at 672 px, 9 pt -> 12 px
    (tmp_path / "tiny.svg").write_text(svg(648, 7))  # 9 in: shrunk to 688 px, 7 pt -> 7.4 px
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + (900).to_bytes(4, "big") + (300).to_bytes(4, "big")
    (tmp_path / "plot.png").write_bytes(png + bytes(20))
    sentence = "Line chart of the backlog against time: it climbs, then drains."
    (tmp_path / "index.html").write_text(
        f'<img src="good.svg" alt="{sentence}"><img src="good.svg" alt="../_images/good.svg">'
        f'<img src="tiny.svg" alt="{sentence}"><img src="plot.png" alt="{sentence}">'
        f'<img src="plot.png" width="450" alt="{sentence}"><img src="gone.svg" alt="{sentence}">'
    )
    assert figure_problems(tmp_path) == [
        "index.html: good.svg (alt '../_images/good.svg' says nothing of what it shows)",
        "index.html: tiny.svg (text shown at 7.4 px)",
        "index.html: plot.png (a 900 px PNG shown 688 px wide: not 2x)",
        "index.html: gone.svg (no such file)",
    ]


def test_search_ships_each_pages_sections_and_text_without_code_scripts_or_answers() -> None:
    """What the search page shows excerpts from when it may not fetch the page (file://)."""
    page = (
        '<nav>menu</nav><main id="main-content" role="main"><div class="header-article">.md .pdf</div>'
        '<article class="bd-article"><!-- a comment --><section id="batching"><h1>Batching'
        '<a class="headerlink" href="#batching">#</a></h1><details class="hide above-input"><summary>Show code cell source'
        '</summary><div class="cell_input"><pre>import numpy</pre></div></details>'
        '<p>Prefill <em>and</em> decode.</p><script>var x = 1;</script><img src="a.svg" alt="chart">'
        '<div class="quiz-explanation">Right.</div></section></article></main>'
    )
    assert (
        searchable_text(page) == '<div role="main"><section id="batching">Batching Prefill and decode. </section></div>'
    )
    assert searchable_text("<p>no main content</p>") == ""


# --- licence and citation ------------------------------------------------------------------


def test_the_licence_is_stated_once_and_the_intro_quotes_it() -> None:
    """LICENSE's first paragraph names both licences and what each covers; the intro shows it, links made live."""
    summary = licence_summary((REPO / "LICENSE").read_text(encoding="utf-8"))
    assert "MIT" in summary and "labkit/" in summary, summary
    assert "CC BY 4.0" in summary and "<https://creativecommons.org/licenses/by/4.0/>" in summary, summary
    assert "{{ licence }}" in (REPO / "book" / "intro.md").read_text(encoding="utf-8")


def test_the_bibtex_entry_names_a_repository_only_when_one_is_set() -> None:
    without = bibtex("Serving many users at once", "labkit course team", "2026", "This copy built on 2026-01-02", "")
    assert without.startswith("```bibtex\n@book{labkit2026serving,\n") and without.endswith("}\n```"), without
    assert "title  = {Serving many users at once}," in without and "author = {{labkit course team}}," in without
    assert "url" not in without
    url = "https://example.org/course"
    assert f"url    = {{{url}}}," in bibtex("Serving many users at once", "labkit course team", "2026", "", url)


# --- the build -----------------------------------------------------------------------------


def test_offline_mathjax_extension_is_installed() -> None:
    """_config.yml loads MathJax from the book itself, so math renders without a network."""
    import importlib.util

    assert importlib.util.find_spec("sphinx-mathjax-offline") is not None, (
        "the book needs the Sphinx extension 'sphinx-mathjax-offline' (MathJax shipped with the book): "
        "pip install sphinx-mathjax-offline==0.0.2, part of labkit's [book] extra"
    )


def jupyter_book_command() -> list[str]:
    script = Path(sys.executable).with_name("jupyter-book")
    return [str(script)] if script.exists() else [sys.executable, "-m", "jupyter_book.cli.main"]


_built: dict[str, Path] = {}  # the one build of this test session, shared with test_browser_book.py


@pytest.fixture(scope="module", name="html")
def built_book(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Build the whole book once per session, chapters executed, into a temporary folder; return its html/ folder.

    LABKIT_BOOK_HTML=_build/html tests a book already built (by `make`) instead, to look again quickly.
    """
    if os.environ.get("LABKIT_BOOK_HTML"):
        return Path(os.environ["LABKIT_BOOK_HTML"]).resolve()
    if "html" in _built:
        return _built["html"]
    out = tmp_path_factory.mktemp("book")
    command = [*jupyter_book_command(), "build", str(REPO), "-W", "--keep-going", "--path-output", str(out)]
    # The chapters import labkit; put this checkout first on the path even where it is not pip-installed.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, cwd=REPO, env=env)
    log = result.stdout + result.stderr
    assert result.returncode == 0, f"jupyter-book build failed (exit {result.returncode}):\n{log[-6000:]}"
    _built["html"] = out / "_build" / "html"
    return _built["html"]


class PageParser(HTMLParser):
    """Collects what a reader would see on a page: images, math, folded answers, navigation links."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.scripts: list[str] = []
        self.math_blocks = 0
        self.dropdowns = 0
        self.prev_links: list[str] = []
        self.next_links: list[str] = []
        self.sidebar_links: list[str] = []
        self.headings: list[str] = []
        self._nav_depth = 0
        self._heading: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attr = {key: value or "" for key, value in attrs}
        classes = attr.get("class", "").split()
        if tag == "img":
            self.images.append(attr.get("src", ""))
        elif tag == "script" and attr.get("src"):
            self.scripts.append(attr["src"])
        if "math" in classes:
            self.math_blocks += 1
        if "dropdown" in classes or tag == "details":
            self.dropdowns += 1
        if tag == "a" and "left-prev" in classes:
            self.prev_links.append(attr.get("href", ""))
        if tag == "a" and "right-next" in classes:
            self.next_links.append(attr.get("href", ""))
        if tag == "nav" and "bd-links" in classes:
            self._nav_depth = 1
        elif tag == "nav" and self._nav_depth:
            self._nav_depth += 1
        if tag == "a" and self._nav_depth:
            self.sidebar_links.append(attr.get("href", ""))
        if tag in ("h1", "h2"):
            self._heading = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "nav" and self._nav_depth:
            self._nav_depth -= 1
        if tag in ("h1", "h2") and self._heading is not None:
            self.headings.append("".join(self._heading).strip())
            self._heading = None

    def handle_data(self, data: str) -> None:
        if self._heading is not None:
            self._heading.append(data)


def parse(page: Path) -> PageParser:
    parser = PageParser()
    parser.feed(page.read_text(encoding="utf-8"))
    return parser


@pytest.mark.parametrize("doc", chapter_docs())
def test_chapter_renders_figures_math_answers_and_navigation(html: Path, doc: str) -> None:
    page = html / f"{doc}.html"
    assert page.is_file(), f"{doc}.html was not built; is {doc}.md listed in _toc.yml?"
    seen = parse(page)

    figures = [src for src in seen.images if src.endswith(".svg") and "_images/" in src]
    assert figures, f"{doc}: no figure computed at build time (expected an <img> of a generated svg)"
    for src in figures:
        image = (page.parent / src).resolve()
        assert image.is_file() and image.stat().st_size > 5_000, f"{doc}: figure {src} is missing or nearly empty"

    assert any("mathjax" in src.lower() for src in seen.scripts), f"{doc}: no MathJax script on the page"
    assert seen.math_blocks, f"{doc}: no math on the page"
    assert seen.dropdowns, f"{doc}: no collapsible answer to a 'predict first' question"
    assert any("remember" in heading.lower() for heading in seen.headings), f"{doc}: no 'What you should remember'"

    assert seen.prev_links and seen.next_links, f"{doc}: missing previous/next links"
    chapters = {Path(other).name + ".html" for other in chapter_docs()}
    in_sidebar = {Path(href.split("#")[0]).name for href in seen.sidebar_links} | {page.name}
    assert chapters <= in_sidebar, f"{doc}: sidebar lacks {sorted(chapters - in_sidebar)}"


def test_every_figure_in_the_built_book_has_an_alt_sentence_and_legible_text(html: Path) -> None:
    problems = figure_problems(html)
    assert not problems, (
        "figures a reader cannot use (describe it in :mystnb: {image: {alt: ...}}, enlarge text):\n"
        + ("\n".join(problems))
    )


def test_every_chapter_page_has_its_checks_with_every_explanation(html: Path) -> None:
    """Every check's options and explanations on the page, each right one findable by the script, not by reading."""
    for doc in chapter_docs():
        text = (html / f"{doc}.html").read_text(encoding="utf-8")
        checks = chapter_checks(doc)
        assert text.count('class="quiz-option') == sum(len(quiz["options"]) for quiz in checks), (
            f"{doc}.html: the page's options differ from its {len(checks)} checks"
        )
        assert text.count('class="quiz-explanation') == text.count('class="quiz-option'), (
            f"{doc}.html: an option lacks its explanation"
        )
        explained = " ".join(re.findall(r'class="quiz-explanation[^"]*">(.*?)</div>', text, flags=re.S))
        told = "quiz-right" in text or "quiz-wrong" in text or "Right." in explained or "Not this one" in explained
        assert not told, f"{doc}.html: the markup says which option is right"
        for quiz in checks:
            salt = salt_of(quiz["question"])
            key = f"quiz-salt-{salt} quiz-key-{scramble(right_position(quiz), salt)}"
            assert key in text, f"{doc}.html: the key of '{quiz['question'][:40]}...' is wrong"
        computed = sum(bool(quiz.get("compute")) for quiz in checks)
        assert text.count("Compute it yourself.") == computed, f"{doc}.html: a compute check lost its label"
        assert "quiz.js" in text, f"{doc}.html: the check's script (book/_ext/quiz_static/quiz.js) is not loaded"


def test_a_reader_finds_the_code_the_setup_and_the_glossary(html: Path) -> None:
    """The code comes with the book (course.zip, the learner's kit); a repository is linked only once one is set."""
    url = repository_url()
    start = (html / "book" / "get_started.html").read_text(encoding="utf-8")
    assert f'href="{url or "../course.zip"}"' in start, "get_started.html does not link to the code"
    shown = re.sub(r"<[^>]+>", "", start)  # the text a reader sees: highlighting splits `make test` into spans
    for command in ("make labs", "labkit.hint", "built on"):
        assert command in shown, f"get_started.html does not mention `{command}`"
    for doc in chapter_docs():
        page = (html / f"{doc}.html").read_text(encoding="utf-8")
        assert ("repository-button" in page) == bool(url), f"{doc}.html: a repository button only where one is set"
    with zipfile.ZipFile(html / "course.zip") as kit:
        names = set(kit.namelist())
    wanted = ["labs/README.md", "labkit/__init__.py", "Makefile", "README.md", "book/intro.md", "_toc.yml"]
    wanted += [f"labs/{lab.notebook}" for lab in LABS]
    assert {f"serving-many-users/{name}" for name in wanted} <= names, "course.zip lacks part of the learner's kit"
    kept_back = [name for name in names if "/labs/source/" in name or "/tests/" in name]
    assert not kept_back, f"course.zip holds the solutions or the tests: {kept_back[:3]}"
    intro_html = (html / "book" / "intro.html").read_text(encoding="utf-8")
    intro = re.sub(r"<[^>]+>", "", intro_html)
    assert re.search(r"built on \d{4}-\d\d-\d\d from (commit \w+|a copy outside git)", intro), "intro: no build date"
    title = yaml.safe_load((REPO / "_config.yml").read_text())["title"]
    for told in ("MIT", "CC BY 4.0", "@book{", "To cite the book", f"title  = {{{title}}}"):
        assert told in intro, f"intro.html does not show {told!r} (licence and citation: book/_ext/colophon.py)"
    assert 'href="https://creativecommons.org/licenses/by/4.0/"' in intro_html, "intro: the CC BY 4.0 link is not live"
    assert (f"url    = {{{url}}}" in intro) == bool(url), "intro: the citation names a repository only when one is set"
    printed = (html.parent / "pdf" / "book.pdf").is_file()  # make book-pdf prints it beside html/
    assert ('href="../book.pdf"' in intro_html) == printed, "intro: the PDF is linked exactly when it was printed"
    assert (html / "book.pdf").is_file() == printed, "the printed PDF is not shipped beside the HTML"
    links = re.findall(r'href="(https?://[^"]+)"', intro_html)
    elsewhere = [link for link in links if "creativecommons.org" not in link and link != url]
    assert not elsewhere, f"intro.html links outside the book where no repository is set: {elsewhere}"

    index = (html / "genindex.html").read_text(encoding="utf-8")
    terms = ["TTFT", "TPOT", "ITL", "E2EL", "goodput", "SLO", "block", "preemption", "critical batch"]
    terms += ["replica", "router", "tensor parallelism", "disaggregation", "quantization", "split-KV"]
    terms += ["online softmax", "offloading tier"]  # chapter 10's and the kernel's words too
    for term in terms:
        assert f">{term}" in index, f"genindex.html lists no '{term}': is it in book/glossary.md's glossary?"
    linking = [doc for doc in chapter_docs() if "glossary.html#term-" in (html / f"{doc}.html").read_text("utf-8")]
    assert len(linking) >= 6, f"only {linking} link a term to the glossary ({{term}}`TTFT` in the chapter)"


def test_each_page_has_one_search_field_and_one_search_button(html: Path) -> None:
    """The sidebar's search field and the page's search button; the theme's top bar, which held only a second
    search field, is not drawn (book/_ext/page_style.py)."""
    for doc in chapter_docs():
        page = (html / f"{doc}.html").read_text(encoding="utf-8")
        assert page.count("search-button-field") == 1, f"{doc}.html: a second search field (the theme's top bar)"
        assert page.count('class="btn btn-sm pst-navbar-icon search-button ') == 1, f"{doc}.html: no search button"
        assert "page_style.css" in page, f"{doc}.html: the book's page rules are not loaded"


def test_bibliography_lists_the_papers_the_chapters_cite(html: Path) -> None:
    text = (html / "book" / "references.html").read_text(encoding="utf-8")
    for paper in ("Orca", "PagedAttention", "SARATHI", "Sarathi-Serve", "Speculative Decoding", "DistServe"):
        assert paper.lower() in text.lower(), f"references page lacks {paper}"
    cited = sum("references.html#" in (html / f"{doc}.html").read_text(encoding="utf-8") for doc in chapter_docs())
    assert cited >= 6, f"only {cited} chapters link a citation to the references page"
