"""The serving engine: requests, scheduler policies, model runner, step loop."""

from labkit.engine.llm import LLM
from labkit.engine.request import Request, RequestOutput, RequestStatus

__all__ = ["LLM", "Request", "RequestOutput", "RequestStatus"]
