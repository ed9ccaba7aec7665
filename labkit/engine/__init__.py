"""The serving engine: requests, scheduler policies, the step loop, model runner.

``LLM`` and ``serve_workload`` are imported on first use: the rest is plain Python that the simulator shares,
and importing it must not load torch and the model code.
"""

from labkit.engine.request import CompletionOutput, Request, RequestOutput, RequestStatus

__all__ = ["LLM", "CompletionOutput", "Request", "RequestOutput", "RequestStatus", "serve_workload"]


def __getattr__(name: str):
    if name in ("LLM", "serve_workload"):
        from labkit.engine import llm

        return getattr(llm, name)
    raise AttributeError(f"module 'labkit.engine' has no attribute {name!r}")
