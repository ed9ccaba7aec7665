"""The book's colophon, written once: when and from which commit it was built, its licence, and how to cite it.

Why: a reader who keeps a copy, quotes it or reuses a figure needs to know which copy it is and on what
terms; each fact comes from the one place that holds it, so no page can fall out of step. The MyST
substitutions:

- ``{{ build_info }}``: "built on <date> from commit <sha>" (git), computed once per build;
- ``{{ licence }}``: the first paragraph of LICENSE, the repository's one statement of its licences;
- ``{{ citation }}``: a sentence naming the book (title, author, year from _config.yml) and this copy;
- ``{{ bibtex }}``: the same as a BibTeX entry. Both give the repository's address only when
  ``repository.url`` is set in _config.yml.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config

ROOT = Path(__file__).resolve().parents[2]
LICENCE = ROOT / "LICENSE"


def commit() -> str | None:
    """The short commit the book is built from, or None outside a git checkout."""
    try:
        found = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return found.stdout.strip() or None


def licence_summary(text: str) -> str:
    """LICENSE's first paragraph, its addresses made links."""
    first = text.strip().split("\n\n")[0]
    return re.sub(r"(https?://[^\s)]+)", r"<\1>", " ".join(first.split()))


def bibtex(title: str, author: str, year: str, note: str, url: str) -> str:
    """A BibTeX ``@book`` entry as a fenced code block; a ``url`` field only when ``url`` is set."""
    key = re.sub(r"\W", "", author.split()[0].lower()) + year + re.sub(r"\W", "", title.split()[0].lower())
    fields = {"title": title, "author": "{" + author + "}", "year": year, "note": note, "url": url}
    lines = [f"  {name:<6} = {{{value}}}," for name, value in fields.items() if value]
    return "```bibtex\n@book{" + key + ",\n" + "\n".join(lines) + "\n}\n```"


def set_up(app: Sphinx, config: Config) -> None:
    """The four substitutions, from git, LICENSE and _config.yml."""
    built = datetime.date.today().isoformat()
    sha = commit()
    copy = f"built on {built} from " + (f"commit `{sha}`" if sha else "a copy outside git")
    url = (config.html_theme_options or {}).get("repository_url", "")
    title, author, year = config.html_title, config.author, str(config.copyright)  # _config.yml's title is html_title
    where = f", <{url}>" if url else ""
    config.myst_substitutions = {
        **config.myst_substitutions,
        "build_info": copy,
        "licence": licence_summary(LICENCE.read_text(encoding="utf-8")),
        "citation": f"{author}, *{title}*, {year}{where}; this copy {copy}.",
        "bibtex": bibtex(title, author, year, f"This copy {copy}".replace("`", ""), url),
    }


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("config-inited", set_up)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
