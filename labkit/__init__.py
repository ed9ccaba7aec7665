"""labkit: the toolkit a learner imports to build an LLM serving engine piece by piece."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``labkit.check`` and ``labkit.hint`` for notebooks, imported on first use (they pull in torch)."""
    if name == "check":
        from labkit.grading import check

        return check
    if name == "hint":
        from labkit.labs.hints import hint

        return hint
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
