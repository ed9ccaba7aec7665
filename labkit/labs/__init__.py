"""What the lab notebooks import: each lab's checks, and the measuring and plotting they share.

- :mod:`~labkit.labs.shared`: the course model (loaded once per kernel), short prompts, seeds;
- :mod:`~labkit.labs.recording`: a stand-in model that writes down every forward pass a learner makes;
- :mod:`~labkit.labs.diagnose`: turns such a recording into "layer 0, position 3: not causal";
- :mod:`~labkit.labs.measure`: timing, this machine's two rates, the roofline plot;
- :mod:`~labkit.labs.timeline`: the picture of a static batch, slot by step;
- :mod:`~labkit.labs.capacity_widget`: how many conversations fit, with sliders;
- :mod:`~labkit.labs.lab1`, ``lab2``, ``lab3``: the exercise specs the checks and the grader use.

Importing a lab module registers its exercises with :mod:`labkit.grading`.
"""
