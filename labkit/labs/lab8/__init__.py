"""Lab 8, speculative decoding: the checks for the learner's proposer, acceptance rules and rollback, a module
each (importing this package registers all four, in the order the notebook shows them)."""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab8 import propose_ngram  # noqa: F401, I001
from labkit.labs.lab8 import accept_greedy  # noqa: F401
from labkit.labs.lab8 import rollback  # noqa: F401
from labkit.labs.lab8 import accept_sampling  # noqa: F401
