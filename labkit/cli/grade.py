"""`labkit grade`: the grading code and its options live in :mod:`labkit.grading.grade`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.grading.grade")
