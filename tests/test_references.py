"""The reference list: one label per source, the text's author-year labels, no entry titled as the book itself."""

from __future__ import annotations

import collections
import importlib.util
from pathlib import Path

import yaml
from pybtex.database import parse_file

REPO = Path(__file__).resolve().parents[1]
ENTRIES = parse_file(str(REPO / "book/references.bib")).entries


def labels_module():
    spec = importlib.util.spec_from_file_location("author_year_labels", REPO / "book/_ext/author_year_labels.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_source_has_its_own_author_year_label() -> None:
    labels = [labels_module().author_year_label(entry) for entry in ENTRIES.values()]
    repeated = [label for label, count in collections.Counter(labels).items() if count > 1]
    assert not repeated, f"two sources share a label (give them years 2025a, 2025b): {repeated}"
    assert "Kwon et al., 2023" in labels and "vLLM Team, 2025a" in labels


def test_a_shared_label_is_caught() -> None:
    module = labels_module()
    first, second = ENTRIES["vllmdisaggprefill"], ENTRIES["vllmnixlconnector"]
    assert module.author_year_label(first) != module.author_year_label(second)
    assert module.author_year_label(first).rsplit(", ", 1)[0] == module.author_year_label(second).rsplit(", ", 1)[0]


def test_no_source_is_cited_under_the_books_own_title_or_without_an_author() -> None:
    """A source without an author is labelled by its title; the lesson sharing the book's title must not be."""
    title = yaml.safe_load((REPO / "_config.yml").read_text())["title"].lower()
    for key, entry in ENTRIES.items():
        if not entry.persons.get("author"):
            assert key == "tenpeople", f"{key}: no author, so its label would be its title"
            assert title not in entry.fields["title"].lower(), f"{key}: labelled with the book's own title"


def test_names_keep_their_case() -> None:
    for key in ("dao2022flashattention", "dao2023flashdecoding", "tillet2019triton"):
        assert ENTRIES[key].fields["title"].startswith("{"), f"{key}: protect the name's case with braces"
    for entry in ENTRIES.values():
        url = entry.fields.get("url")
        assert url is None or url.startswith("https://"), url
