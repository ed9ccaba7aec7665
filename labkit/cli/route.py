"""`labkit route`: the router's code and its options live in :mod:`labkit.serve.route_cli`; this only plugs it in."""

from labkit.cli._delegate import delegate

add_arguments, run = delegate("labkit.serve.route_cli")
