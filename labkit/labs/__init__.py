"""The course's labs: one package per lab, what they share, and the manifest that lists them.

- ``labN``: one package per lab notebook (the manifest below lists them). Its ``__init__`` holds the **exercise specs**
  (what each exercise asks for, the inputs a check builds from a seed, the oracle it compares with,
  the hints) and registers them with :mod:`labkit.grading`, which finds them by these names
  (``labkit.labs.lab5``); modules beside it hold the run helpers only that lab uses (lab 9's server
  loop, dashboard, admission and capacity checks in ``lab9/``).
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
