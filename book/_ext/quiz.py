"""The `quiz` directive: an end-of-chapter check whose every option explains itself when picked.

Why: a wrong answer teaches most when the reader learns why it tempted them and why it
fails, so each option carries its own explanation, shown only once that option is clicked.
The question lives in one place, the directive's YAML body, and works offline (a local
script and stylesheet, no network). A malformed question stops the build with a message
that names the chapter and the fix.

The page's markup does not say which option is right (no class, no "Right." in the text):
the box carries the right option's position scrambled with a salt drawn from the question
(classes ``quiz-salt-N`` and ``quiz-key-N``; :func:`scramble`), and the script decides when an
option is picked. Across the book the right answers must not give themselves away: no position holds
more than half of them, nor is the right answer the longest option in more than half
(:func:`spread_problems`, checked once every chapter is read).

    ```{quiz}
    question: A scenario and what to decide.
    options:
      - answer: A tempting wrong answer.
        why: Why it is tempting, and why it is wrong.
      - answer: The right answer.
        right: true
        why: Why it is right.
    ```
"""

from __future__ import annotations

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


def spread_problems(records: list[tuple[str, int, int, bool]]) -> list[str]:
    """What gives the right answers away across the book, from each check's (page, right position, options, right
    option is the longest): a position holding more than half of them, or the longest option right in more than
    half. Empty below four checks, too few to tell."""
    if len(records) < 4:
        return []
    problems = []
    for position in {right for _, right, _, _ in records}:
        pages = [page for page, right, _, _ in records if right == position]
        if len(pages) > len(records) / 2:
            problems.append(f"option {position + 1} is right in {len(pages)} of {len(records)} checks ({pages})")
    longest = [page for page, _, _, is_longest in records if is_longest]
    if len(longest) > len(records) / 2:
        problems.append(f"the right answer is the longest option in {len(longest)} of {len(records)} checks {longest}")
    return problems


class QuizError(ValueError):
    """A quiz whose YAML does not describe one question with 3-4 explained options, one of them right."""


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
    right = sum(option.get("right") is True for option in options)
    if right != 1:
        raise QuizError(f"exactly one option must say `right: true`, found {right}")
    return quiz


class QuizDirective(SphinxDirective):
    """A question, then one clickable option per answer, each followed by its folded explanation."""

    has_content = True

    def run(self) -> list[nodes.Node]:
        try:
            quiz = read_quiz("\n".join(self.content))
        except QuizError as error:
            raise self.error(f"quiz in {self.env.docname}: {error}") from error
        right = next(index for index, option in enumerate(quiz["options"]) if option.get("right") is True)
        salt = salt_of(quiz["question"])
        # docutils writes classes, not data attributes: the salt and the scrambled position ride as two classes
        box = nodes.container(classes=["quiz", f"quiz-salt-{salt}", f"quiz-key-{scramble(right, salt)}"])
        box += self.parse_text_to_nodes(quiz["question"])
        for option in quiz["options"]:
            choice = nodes.container(classes=["quiz-option"])
            answer = nodes.container(classes=["quiz-answer"])
            answer += self.parse_text_to_nodes(option["answer"])
            explanation = nodes.container(classes=["quiz-explanation"])
            explanation += self.parse_text_to_nodes(option["why"])
            choice += [answer, explanation]
            box += choice
        lengths = [len(option["answer"]) for option in quiz["options"]]
        records = self.env.__dict__.setdefault("quiz_records", {}).setdefault(self.env.docname, [])
        records.append((self.env.docname, right, len(lengths), lengths[right] == max(lengths)))
        return [box]


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def check_spread(app: Sphinx, env) -> None:
    """Stop the build when the right answers cluster (see :func:`spread_problems`)."""
    records = [record for page in getattr(env, "quiz_records", {}).values() for record in page]
    problems = spread_problems(records)
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
