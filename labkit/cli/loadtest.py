"""`labkit loadtest`: the load testing code and its options live in :mod:`labkit.serve.loadtest_cli`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.serve.loadtest_cli")
