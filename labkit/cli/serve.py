"""`labkit serve`: the serving code and its options live in :mod:`labkit.serve.serve_cli`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.serve.serve_cli")
