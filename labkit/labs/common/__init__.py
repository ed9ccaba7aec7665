"""What the checks of two labs or more share; a helper that only one lab uses belongs in that lab's package.

- :mod:`~labkit.labs.common.shared`: the course model (loaded once per kernel), short prompts, seeds, the
  transformers oracle;
- :mod:`~labkit.labs.common.recording`: a stand-in model that writes down every forward pass (labs 1-3);
- :mod:`~labkit.labs.common.diagnose`: turns such a recording into "layer 0, position 3: not causal", and a
  caught exception into "your function f raised X at line N of your cell" (``diagnosed``);
- :mod:`~labkit.labs.common.pieces`: a learner's chain of exercises checked piece by piece, each with the
  course's own pieces in place of the others (labs 1 and 3);
- :mod:`~labkit.labs.common.learner_errors`: an exception in the learner's code caught as a plain record in the
  kernel (``noting_errors`` for a function the engine calls, such as a scheduling policy);
- :mod:`~labkit.labs.common.mistakes`: the typical mistake a wrong answer shows, named by the answers each gives;
- :mod:`~labkit.labs.common.gate`: ``passed(exercise_id)``, so a demo cell runs only once its exercise passes;
- :mod:`~labkit.labs.common.engine_runs`: the engine run with a learner's scheduler, allocator or attention
  plugged in, on a ticking clock (labs 4-9); :mod:`~labkit.labs.common.solo` judges such a run against each
  request decoded alone.
- :mod:`~labkit.labs.common.scheduling`: a learner's scheduling policy watched decision by decision, with
  labkit's own policy out of its reach (labs 4, 6 and 9).

Which of them only the grader holds (hidden in the grading sandbox) is listed in ``labkit/grading/grader_only.py``.
"""
