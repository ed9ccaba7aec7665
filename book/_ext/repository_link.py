"""The course repository's address, from `repository.url` in _config.yml, as the MyST substitution {{ repository }}.

Why: the header's repository button and the Get started page must name the same address, so
it is written once, in _config.yml, and a fork changes it there.
"""

from __future__ import annotations

from sphinx.application import Sphinx
from sphinx.config import Config
from sphinx.errors import ConfigError


def add_repository_substitution(app: Sphinx, config: Config) -> None:
    """Make {{ repository }} a link to the repository that _config.yml names."""
    url = (config.html_theme_options or {}).get("repository_url", "")
    if not url:
        raise ConfigError(
            "the book links to its code, but _config.yml sets no repository address: "
            "add `repository: url: https://...` to _config.yml"
        )
    config.myst_substitutions = {**config.myst_substitutions, "repository": f"[{url}]({url})"}


def setup(app: Sphinx) -> dict[str, bool]:
    app.connect("config-inited", add_repository_substitution)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
