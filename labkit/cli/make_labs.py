"""`labkit make-labs`: the grading code and its options live in :mod:`labkit.grading.make_labs`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.grading.make_labs")
