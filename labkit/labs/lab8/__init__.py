"""Lab 8, speculative decoding: the checks for the learner's proposer and acceptance rules.

Four exercises, each checked in its own module (importing this package registers all four checks, in the order
the notebook shows them):

- ``propose_ngram(token_ids, k, min_n, max_n)`` (``lab8.propose_ngram``, :mod:`~labkit.labs.lab8.propose_ngram`):
  prompt lookup. Checked against the engine's own proposer on seeded sequences.
- ``accept_greedy(draft, target_argmax)`` (``lab8.accept_greedy``, :mod:`~labkit.labs.lab8.accept_greedy`): the
  longest prefix of the draft that the target agrees with, plus one token of the target's own. Checked on crafted
  cases, then inside the engine.
- ``rollback(request, num_rejected, blocks)`` (``lab8.rollback``, :mod:`~labkit.labs.lab8.rollback`): the KV of
  rejected drafts undone. Checked on crafted block tables, then inside the engine, watching every step for blocks
  held in vain.
- ``accept_sampling(draft, draft_probs, target_probs, generator)`` (``lab8.accept_sampling``,
  :mod:`~labkit.labs.lab8.accept_sampling`): the speculative-sampling rule. Checked by the distribution of what it
  returns over thousands of seeded draws.

The engine runs of the greedy and rollback checks are in :mod:`~labkit.labs.lab8.served` (over
:mod:`~labkit.labs.lab8.runs`).
"""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab8 import propose_ngram  # noqa: F401, I001
from labkit.labs.lab8 import accept_greedy  # noqa: F401
from labkit.labs.lab8 import rollback  # noqa: F401
from labkit.labs.lab8 import accept_sampling  # noqa: F401
