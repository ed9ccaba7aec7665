"""Serving for real: an OpenAI-compatible HTTP server over the engine, a router over several, and a load tester.

Each module's docstring says what it does. ``labkit serve`` is :mod:`~labkit.serve.protocol` (OpenAI's wire
format), :mod:`~labkit.serve.text`, :mod:`~labkit.serve.worker` (the one thread that runs the engine loop for
every HTTP client), :mod:`~labkit.serve.admission`, :mod:`~labkit.serve.prometheus`, :mod:`~labkit.serve.dtype`,
:mod:`~labkit.serve.app` and :mod:`~labkit.serve.body` (the routes), :mod:`~labkit.serve.guard` and
:mod:`~labkit.serve.server` (uvicorn). ``labkit route`` is the ``router_*`` modules and
:mod:`~labkit.serve.replica_procs`; ``labkit loadtest`` is :mod:`~labkit.serve.loadtest`, which
:mod:`~labkit.serve.background` and :mod:`~labkit.serve.watch` drive from a notebook; ``serve_cli``,
``route_cli`` and ``loadtest_cli`` are the commands.

Nothing is imported here, so the load tester and the router never load torch or the model code (but for
``cache_aware``'s tokenizer: importing :mod:`labkit.models` brings torch).
"""
