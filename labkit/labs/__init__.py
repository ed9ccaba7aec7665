"""The course's labs: one package per lab, what they share, and the manifest that lists them.

- ``labN``: one package per lab notebook (the manifest below lists them), a module per exercise or part: its
  **exercise spec** (what the exercise asks for, the inputs a check builds from a seed, the oracle it compares
  with, the comparison as a chain of named checks, the hints), registered with :mod:`labkit.grading`, which
  finds them through the package (``labkit.labs.lab5``), whose ``__init__`` imports them in the notebook's
  order; beside them the run helpers only that lab uses (lab 9's server loop and load, lab 12's replay).
- :mod:`~labkit.labs.manifest`: one entry per lab (notebook, marker, seeds, cost); every list of labs
  (pytest markers, the tests that grade every lab, the labs README, the book) is built from it or
  checked against it.
- :mod:`~labkit.labs.common`: what several labs' checks share (see its docstring for what belongs there).
- :mod:`~labkit.labs.api`: the one surface notebooks import (a test holds them to it), so the
  modules above can change without breaking a notebook already handed out.
- :mod:`~labkit.labs.hints`: ``labkit.hint(exercise_id)``, the next of an exercise's hints
  (the idea, then the structure, then near-code), counted per kernel.
- :mod:`~labkit.labs.aids`: teaching aids the notebooks show and no check needs (timing and
  this machine's roofline, the capacity sliders, the padded cache of lab 3).

Pictures every lab and the book share live in :mod:`labkit.viz`.
"""
