"""`labkit bench`: for now the benchmark's options live in :mod:`labkit.bench`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.bench")
