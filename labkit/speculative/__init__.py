"""Speculative decoding: draft k tokens cheaply, let the target model check them all in one pass.

The four pieces a learner can replace (lab 8): :func:`propose_ngram`, :func:`accept_greedy` and
:func:`accept_sampling`, :func:`rollback`; ``LLM(..., speculative_config={...})`` wires them in.
"""

from labkit.speculative.accept import accept_greedy, accept_sampling, one_hot_probs
from labkit.speculative.config import SpeculativeConfig, parse_speculative_config
from labkit.speculative.ngram import propose_ngram
from labkit.speculative.rollback import rollback

__all__ = [
    "propose_ngram",
    "accept_greedy",
    "accept_sampling",
    "one_hot_probs",
    "rollback",
    "SpeculativeConfig",
    "parse_speculative_config",
]
