"""`labkit make-autograder`: the bundle lives in :mod:`labkit.grading.autograder_bundle`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.grading.autograder_bundle")
