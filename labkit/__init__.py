"""labkit: the toolkit a learner imports to build an LLM serving engine piece by piece."""

__version__ = "0.1.0"


def __getattr__(name: str):
    """``labkit.check`` for notebooks, imported on first use (it pulls in torch)."""
    if name == "check":
        from labkit.grading import check

        return check
    raise AttributeError(f"module 'labkit' has no attribute {name!r}")
