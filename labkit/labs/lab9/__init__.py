"""Lab 9, the capstone: the checks for the learner's engine loop, policy, dashboard, admission and SLO sweep, a
module each (importing this package registers all six, in the order the notebook shows them)."""

# the exercises register in the order the notebook shows them, not sorted
from labkit.labs.lab9 import engine_turn  # noqa: F401, I001
from labkit.labs.lab9 import policy  # noqa: F401
from labkit.labs.lab9 import dashboard  # noqa: F401
from labkit.labs.lab9 import admission  # noqa: F401
from labkit.labs.lab9 import highest_rate  # noqa: F401
from labkit.labs.lab9 import find_capacity  # noqa: F401
