"""The `quiz` directive: an end-of-chapter check whose every option explains itself when picked.

Why: a wrong answer teaches most when the reader learns why it tempted them and why it
fails, so each option carries its own explanation, shown only once that option is clicked.
The question lives in one place, the directive's YAML body, and works offline (a local
script and stylesheet, no network). A malformed question stops the build with a message
that names the chapter and the fix.

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
        box = nodes.container(classes=["quiz"])
        box += self.parse_text_to_nodes(quiz["question"])
        for option in quiz["options"]:
            verdict = "right" if option.get("right") is True else "wrong"
            choice = nodes.container(classes=["quiz-option", f"quiz-{verdict}"])
            answer = nodes.container(classes=["quiz-answer"])
            answer += self.parse_text_to_nodes(option["answer"])
            explanation = nodes.container(classes=["quiz-explanation"])
            label = "Right. " if verdict == "right" else "Not this one. "
            paragraphs = self.parse_text_to_nodes(option["why"])
            if paragraphs and isinstance(paragraphs[0], nodes.paragraph):
                paragraphs[0].insert(0, nodes.strong(text=label))
            explanation += paragraphs
            choice += [answer, explanation]
            box += choice
        return [box]


def add_static_path(app: Sphinx) -> None:
    app.config.html_static_path.append(str(STATIC))


def setup(app: Sphinx) -> dict[str, bool]:
    app.add_directive("quiz", QuizDirective)
    app.connect("builder-inited", add_static_path)
    app.add_js_file("quiz.js")
    app.add_css_file("quiz.css")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
