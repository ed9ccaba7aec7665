"""What the exercise specs check with; the notebooks use some of it too.

- :mod:`~labkit.labs.checking.shared`: the course model (loaded once per kernel), short
  prompts, seeds, the transformers oracle, ``after_exercise`` for cells that wait on a blank;
- :mod:`~labkit.labs.checking.recording`: a stand-in model that writes down every forward pass;
- :mod:`~labkit.labs.checking.diagnose`: turns such a recording into "layer 0, position 3: not causal";
- :mod:`~labkit.labs.checking.learner_errors`: an exception in the learner's code reported as "your
  function f raised X at line N of your cell", with the exercise's hint (``noting_errors`` for a
  function the engine calls, such as a scheduling policy);
- :mod:`~labkit.labs.checking.gate`: ``passed(exercise_id)``, so a demo cell runs only once its
  exercise passes its check;
- :mod:`~labkit.labs.checking.engine_runs`: the engine run with a learner's scheduler, allocator
  or attention plugged in, on a ticking clock, and judged against solo decoding (labs 4-6).
- :mod:`~labkit.labs.checking.prefix_runs`: the prefix-caching allocator with a learner's hash chain,
  lookup or free plugged in, and its pool compared with labkit's after every call (lab 7);
- :mod:`~labkit.labs.checking.spec_runs`: the engine with speculation on and a learner's proposer,
  acceptance rule or rollback plugged in (lab 8); :mod:`~labkit.labs.checking.spec_sampling`: a
  speculative-sampling rule judged by the distribution it produces;
- :mod:`~labkit.labs.checking.serve_loop`, :mod:`~labkit.labs.checking.serve_metrics`,
  :mod:`~labkit.labs.checking.serve_sweep`: lab 9's engine loop, ``/metrics`` window and SLO search.
"""
