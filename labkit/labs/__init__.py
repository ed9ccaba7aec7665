"""The course's labs, in two kinds of module that are easy to tell apart.

- ``lab1`` ... ``lab10``: the **exercise specs**, one module per lab notebook: what each
  exercise asks for, the inputs a check builds from a seed, the oracle it compares with,
  and the hints. Importing one registers its exercises with :mod:`labkit.grading`, which
  finds them by these names (``labkit.labs.lab5``).
- :mod:`~labkit.labs.api`: the one surface notebooks import (a test holds them to it), so the
  modules below can change without breaking a notebook already handed out.
- :mod:`~labkit.labs.checking`: what the specs check with (the course model loaded once,
  seeded prompts, a model that records every forward pass, diagnoses of attention mistakes,
  runs of the engine with a learner's piece plugged in).
- :mod:`~labkit.labs.hints`: ``labkit.hint(exercise_id)``, the next of an exercise's hints
  (the idea, then the structure, then near-code), counted per kernel.
- :mod:`~labkit.labs.aids`: teaching aids the notebooks show and no check needs (timing and
  this machine's roofline, the capacity sliders, the padded cache of lab 3).

Pictures every lab and the book share live in :mod:`labkit.viz`.
"""
