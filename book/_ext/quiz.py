"""The `quiz` directive: an end-of-chapter check whose every option explains itself when picked.

Why: a wrong answer teaches most when the reader learns why it tempted them and why it
fails, so each option carries its own explanation, shown only once that option is clicked.
The question lives in one place, the directive's YAML body, and works offline (a local
script and stylesheet, no network). A malformed question stops the build with a message
that names the chapter and the fix.

The page's markup does not say which option is right (no class, no "Right." in the text):
the box carries the right option's position scrambled with a salt drawn from the question
(classes ``quiz-salt-N`` and ``quiz-key-N``; :func:`scramble`), and the script decides when an
option is picked. The right answers must not give themselves away, in the book or in one chapter:
no position may hold the right answer, nor may the longest (or the shortest) option be the right
one, in more than one and a half times the checks that chance would give it (:func:`spread_problems`, checked once
every chapter is read; the build stops otherwise).

A check marked ``compute: true`` asks the reader to work a number out; it is labelled "Compute it
yourself", and its right option's explanation must show the working (an equation with ``=``).

    ```{quiz}
    question: A scenario and what to decide.
    options:
      - answer: A tempting wrong answer.
        why: Why it is tempting, and why it is wrong.
      - answer: The right answer.
        right: true
        why: Why it is right.
    ```

Add ``compute: true`` below ``question:`` for a number the reader works out.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import yaml
from docutils import nodes
from sphinx.application import Sphinx
from sphinx.util.docutils import SphinxDirective

STATIC = Path(__file__).with_name("quiz_static")
OPTIONS_ALLOWED = range(3, 5)
MODULUS = 101  # the scramble's: any prime above the number of options


def salt_of(question: str) -> int:
    """A number from 1 to 100 that depends on the question's text, the same on every build."""
    return sum(ord(character) for character in question) % (MODULUS - 1) + 1


def scramble(position: int, salt: int) -> int:
    """What the page holds for the right option's position (0-based); quiz.js computes the same for each option."""
    return (position * 37 + salt) % MODULUS


SHARE_LIMIT = 1.5  # how many times its chance share a position (or "the longest option") may be right
FEW = 2  # so few right answers in one position say nothing, whatever chance expects
SHUNNED_FROM = 6  # chance's count from which a position (or length) right too rarely is a sign too


def clustered(count: int, chance: float) -> bool:
    """Whether ``count`` right answers tell a reader more than ``chance`` would: far too many, or (with enough
    checks to tell) far too few."""
    chance = round(chance, 6)  # a sum of thirds: 8.0, not 7.999999999999998
    too_many = count > max(SHARE_LIMIT * chance, FEW)
    return too_many or (chance >= SHUNNED_FROM and count < chance / SHARE_LIMIT)


Record = tuple[str, int, tuple[int, ...]]  # a check's page, its right option's position (0-based), its options' lengths


def spread_problems(records: list[Record]) -> list[str]:
    """What gives the right answers away, from each check's (page, right position, option lengths): a position
    right in more than 1.5 times the checks chance would put there (1/options of each check that has that
    position), or the longest (or the shortest, unless tied) option right that much more often than chance; and,
    where chance expects six or more, any of them right in fewer than 1/1.5 of those (a reader learns to avoid
    it). Empty below four checks, too few to tell."""
    if len(records) < 4:
        return []
    problems = []
    for position in range(max(len(lengths) for _, _, lengths in records)):
        pages = [page for page, right, _ in records if right == position]
        chance = sum(1 / len(lengths) for _, _, lengths in records if len(lengths) > position)
        if clustered(len(pages), chance):
            problems.append(
                f"option {position + 1} is right in {len(pages)} of {len(records)} checks, "
                f"{chance:.1f} by chance ({pages})"
            )
    chance = sum(1 / len(lengths) for _, _, lengths in records)
    for extreme, pick in (("longest", max), ("shortest", min)):
        alone = [(page, right, lengths) for page, right, lengths in records if lengths.count(lengths[right]) == 1]
        pages = [page for page, right, lengths in alone if lengths[right] == pick(lengths)]  # a tie tells nothing
        if clustered(len(pages), chance):
            problems.append(
                f"the right answer is the {extreme} option in {len(pages)} of {len(records)} checks, "
                f"{chance:.1f} by chance {pages}"
            )
    return problems


# Patterns a reader can follow from one check's right answer to the next (options counted 0-based; `n` options in
# the later check): each names the position it predicts from the last two right positions.
FOLLOWABLE: dict[str, Callable[[int, int | None, int], int]] = {
    "the same as the previous check's": lambda last, _, n: last,
    "the option after the previous check's (back to the first past the last)": lambda last, _, n: (last + 1) % n,
    "the option before the previous check's": lambda last, _, n: (last - 1) % n,
    "two options after the previous check's": lambda last, _, n: (last + 2) % n,
    "the same as the one two checks back": lambda last, before, n: -1 if before is None else before,
}


def sequence_problems(records: list[Record]) -> list[str]:
    """What the order of the right answers gives away, from the checks in reading order: a pattern of
    :data:`FOLLOWABLE` (the same letter again, the next letter, a cycle) that predicts the next right option in
    more than 1.5 times the checks chance would (1/options of each), or, where chance expects six or more, in
    fewer than 1/1.5 of them (a reader learns to avoid it). Empty below four checks, too few to tell."""
    if len(records) < 4:
        return []
    problems = []
    for pattern, predict in FOLLOWABLE.items():
        pairs = [
            (records[index - 2][1] if index >= 2 else None, records[index - 1][1], records[index])
            for index in range(1, len(records))
        ]
        judged = [
            (before, last, record) for before, last, record in pairs if predict(last, before, len(record[2])) >= 0
        ]
        hits = [record[0] for before, last, record in judged if record[1] == predict(last, before, len(record[2]))]
        chance = sum(1 / len(record[2]) for _, _, record in judged)
        if judged and clustered(len(hits), chance):
            problems.append(
                f"the right option is {pattern} in {len(hits)} of {len(judged)} checks, {chance:.1f} by chance"
            )
    return problems


def spread_problems_by_page(records: list[Record]) -> list[str]:
    """:func:`spread_problems` and :func:`sequence_problems` over the whole book (``records`` in reading order),
    then over each page's own checks (a reader takes them together)."""
    problems = spread_problems(records) + sequence_problems(records)
    for page in dict.fromkeys(page for page, _, _ in records):
        own = [r for r in records if r[0] == page]
        problems += [f"in {page}: {problem}" for problem in spread_problems(own) + sequence_problems(own)]
    return problems


class QuizError(ValueError):
    """A quiz whose YAML does not describe one question with 3-4 explained options, one of them right (and worked,
    for a `compute: true` check)."""


def read_quiz(text: str) -> dict:
    """The question and its options from the directive's YAML body, checked for the quiz's shape."""
    try:
        quiz = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise QuizError(f"its body is not valid YAML ({error}); indent it as in book/_ext/quiz.py") from error
    if not isinstance(quiz, dict) or not isinstance(quiz.get("question"), str):
        raise QuizError("it needs a `question:` line holding the scenario and what to decide")
    options = quiz.get("options")
    if not isinstance(options, list) or len(options) not in OPTIONS_ALLOWED:
        raise QuizError(f"it needs 3 or 4 `options:`, found {len(options) if isinstance(options, list) else 0}")
    for number, option in enumerate(options, start=1):
        if not isinstance(option, dict) or not option.get("answer") or not option.get("why"):
            raise QuizError(
                f"option {number} needs both `answer:` and `why:` (why it tempts, why it is wrong or right)"
            )
        if not isinstance(option["answer"], str) or not isinstance(option["why"], str):
            raise QuizError(f"option {number}'s `answer:` and `why:` must be text: quote a bare number ('115')")
    right = [option for option in options if option.get("right") is True]
    if len(right) != 1:
        raise QuizError(f"exactly one option must say `right: true`, found {len(right)}")
    if quiz.get("compute", False) not in (True, False):
        raise QuizError(f"`compute:` is true or false, found {quiz['compute']!r}")
    if quiz.get("compute") and "=" not in right[0]["why"]:
        raise QuizError(
            "a `compute: true` check must show the working in its right option's `why:` (an equation with `=`)"
        )
    return quiz


class QuizDirective(SphinxDirective):
    """A question, then one clickable option per answer, each followed by its folded explanation."""

    has_content = True

    def parse_prose(self, text: str) -> list[nodes.Node]:
        """A check's text as the page's markup, where a `$` is money, never the start of math ("$2.00 an hour")."""
        return self.parse_text_to_nodes(text.replace("$", "\\$"))

    def run(self) -> list[nodes.Node]:
        try:
            quiz = read_quiz("\n".join(self.content))
        except QuizError as error:
            raise self.error(f"quiz in {self.env.docname}: {error}") from error
        right = next(index for index, option in enumerate(quiz["options"]) if option.get("right") is True)
        salt = salt_of(quiz["question"])
        # docutils writes classes, not data attributes: the salt and the scrambled position ride as two classes
        box = nodes.container(classes=["quiz", f"quiz-salt-{salt}", f"quiz-key-{scramble(right, salt)}"])
        if quiz.get("compute"):
            box += nodes.paragraph("", "", nodes.strong("", "Compute it yourself."), classes=["quiz-compute"])
        box += self.parse_prose(quiz["question"])
        for option in quiz["options"]:
            choice = nodes.container(classes=["quiz-option"])
            answer = nodes.container(classes=["quiz-answer"])
            answer += self.parse_prose(option["answer"])
            explanation = nodes.container(classes=["quiz-explanation"])
            explanation += self.parse_prose(option["why"])
            choice += [answer, explanation]
            box += choice
        lengths = tuple(len(option["answer"]) for option in quiz["options"])
        records = self.env.__dict__.setdefault("quiz_records", {}).setdefault(self.env.docname, [])
        records.append((self.env.docname, right, lengths))
        return [box]


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def reading_order(includes: dict[str, list[str]], root: str) -> dict[str, int]:
    """Each page's place in the book's reading order: the table of contents walked depth first from the root."""
    order: dict[str, int] = {}
    stack = [root]
    while stack:
        page = stack.pop()
        if page not in order:
            order[page] = len(order)
            stack.extend(reversed(includes.get(page, [])))
    return order


def check_spread(app: Sphinx, env) -> None:
    """Stop the build when the right answers cluster, in the book or in one page (see :func:`spread_problems`)."""
    pages = getattr(env, "quiz_records", {})
    order = reading_order(env.toctree_includes, app.config.root_doc)
    records = [record for page in sorted(pages, key=lambda page: order.get(page, len(order))) for record in pages[page]]
    problems = spread_problems_by_page(records)
    if problems:
        raise QuizError(
            "the checks' right answers give themselves away: "
            + "; ".join(problems)
            + (". Move right answers to other positions, or reword options so length tells nothing")
        )


def forget_page(app: Sphinx, env, docname: str) -> None:
    getattr(env, "quiz_records", {}).pop(docname, None)


def merge_records(app: Sphinx, env, docnames, other) -> None:
    env.__dict__.setdefault("quiz_records", {}).update(getattr(other, "quiz_records", {}))


def setup(app: Sphinx) -> dict[str, bool]:
    app.add_directive("quiz", QuizDirective)
    app.connect("builder-inited", add_static_path)
    app.connect("env-purge-doc", forget_page)
    app.connect("env-merge-info", merge_records)
    app.connect("env-check-consistency", check_spread)
    app.add_js_file("quiz.js")
    app.add_css_file("quiz.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
