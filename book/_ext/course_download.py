"""The way to the code, written once: a download of the course built with the book, or a repository a fork names.

Why: the book must never show a link that leads nowhere. Every build puts ``course.zip`` at the root of the
HTML: the learner's kit (``labkit``, the learner notebooks and ``labs/README.md``, the book's sources, the
Makefile; not the tests or the solved notebooks), so a reader has the code whether or not it is published
anywhere. Its README is the kit's own (``course_kit_README.md``), naming only what the kit holds and the
commands that run from a fresh unzip: the repository's README promises tests and CI the kit leaves out. A fork that publishes its repository sets ``repository.url`` in _config.yml; only then do
the header's repository button and the Get started page link to it. The MyST substitutions:

- ``{{ code_link }}``: the repository's address if one is set, else the download;
- ``{{ download }}``: the download;
- ``{{ book_pdf }}``: a sentence linking the whole book as one PDF, where ``make book-pdf`` has printed one
  (``_build/pdf/book.pdf``, beside this build's ``html/``); nothing where none was printed.

The build's date and commit, the licence and how to cite the book are book/_ext/colophon.py's.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.config import Config

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = "course.zip"
FOLDER = "serving-many-users"  # the folder the archive unpacks into
# What a learner needs to run the course; the tests and labs/source (the solutions) stay with instructors.
KIT = (
    "labkit",
    "labs",
    "book",
    "scripts",
    "Makefile",
    "LICENSE",
    "pyproject.toml",
    "environment.yml",
    "_config.yml",
    "_toc.yml",
)
KIT_README = Path(__file__).with_name("course_kit_README.md")  # the kit's README.md
LEFT_OUT = ("labs/source/", str(KIT_README.relative_to(ROOT)))
PDF = "book.pdf"


def kit_files() -> list[Path]:
    """The files of the learner's kit: tracked by git where there is a checkout, else every file of KIT."""
    listed = subprocess.run(["git", "ls-files", "--", *KIT], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0 and listed.stdout.strip():
        names = listed.stdout.split("\n")
    else:
        names = [str(p.relative_to(ROOT)) for name in KIT for p in [ROOT / name, *(ROOT / name).rglob("*")]]
    files = sorted({ROOT / name for name in names if name and not name.startswith(LEFT_OUT)})
    return [path for path in files if path.is_file() and "__pycache__" not in path.parts]


def write_archive(folder: Path) -> Path:
    """``course.zip`` in ``folder``, its files under one top folder."""
    archive = folder / ARCHIVE
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in kit_files():
            zipped.write(path, f"{FOLDER}/{path.relative_to(ROOT)}")
        zipped.write(KIT_README, f"{FOLDER}/README.md")
    return archive


def printed_pdf(html_folder: Path) -> Path | None:
    """The PDF ``make book-pdf`` printed beside this build's HTML folder, or None."""
    pdf = html_folder.parent / "pdf" / PDF
    return pdf if pdf.is_file() else None


def set_up(app: Sphinx, config: Config) -> None:
    """Build the archive beside the HTML, point the substitutions at it, and hide an unset repository's button."""
    extra = Path(tempfile.mkdtemp(prefix="course-download-"))
    write_archive(extra)
    pdf = printed_pdf(Path(app.outdir))
    if pdf:
        shutil.copy(pdf, extra / PDF)
    config.html_extra_path = [*config.html_extra_path, str(extra)]
    theme = dict(config.html_theme_options or {})
    url = theme.get("repository_url", "")
    config.html_theme_options = {**theme, "use_repository_button": bool(url)}
    # Pages sit one folder down (book/, labs/), the archive at the root of the HTML.
    download = f'<a href="../{ARCHIVE}" download>{ARCHIVE}</a>'
    config.myst_substitutions = {
        **config.myst_substitutions,
        "download": download,
        "code_link": f"[{url}]({url})" if url else download,
        "book_pdf": f'The whole book is also one PDF: <a href="../{PDF}" download>{PDF}</a>.' if pdf else "",
    }


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("config-inited", set_up)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
