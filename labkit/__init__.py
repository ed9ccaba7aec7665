"""labkit: the toolkit a learner imports to build an LLM serving engine piece by piece."""

__version__ = "0.1.0"
