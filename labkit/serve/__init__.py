"""Serving for real: an OpenAI-compatible HTTP server over the engine, a router over several, and a load tester.

- :mod:`~labkit.serve.protocol`: OpenAI request validation and response shapes, errors included;
- :mod:`~labkit.serve.text`: token ids to streamed text, with stop strings;
- :mod:`~labkit.serve.worker`: the one thread that runs the engine loop for every HTTP client;
- :mod:`~labkit.serve.admission`: admission control, 503 + Retry-After when a request would wait past the promise
  (labkit's own: vLLM queues every request);
- :mod:`~labkit.serve.prometheus`: the server's Prometheus metrics, with vLLM's names and buckets;
- :mod:`~labkit.serve.dtype`: the dtype the server computes in (bf16 only where tried and measured faster);
- :mod:`~labkit.serve.app`: the routes (starlette) and auth; :mod:`~labkit.serve.body`: a JSON body read within
  its size and time limits, errors in OpenAI's shape (the router shares them);
- :mod:`~labkit.serve.server`: uvicorn running the app, in the foreground or in a thread (tests, notebooks);
- :mod:`~labkit.serve.loadtest`: ``vllm bench serve``'s job with the ``openai`` client;
- :mod:`~labkit.serve.background` and :mod:`~labkit.serve.watch`: a server, loads and scrapes from a notebook,
  with a live plot of the gauges while a load runs;
- :mod:`~labkit.serve.router_policies` (what the router knows of a request: its text, its tokens; the policies
  are the engine's router registry), :mod:`~labkit.serve.router_caches` (what it knows of each replica's prefix
  cache: its KV events, else a shadow index), :mod:`~labkit.serve.router_app` (the
  router's routes: forward, retry before any answer byte), :mod:`~labkit.serve.router_health` (replicas ejected
  and readmitted), :mod:`~labkit.serve.router_relay` (one answer relayed as it comes),
  :mod:`~labkit.serve.router_prometheus` (per replica), :mod:`~labkit.serve.router_server` (uvicorn, a thread) and
  :mod:`~labkit.serve.replica_procs` (``labkit serve`` replicas as child processes, reaped and restarted):
  ``labkit route``;
- ``serve_cli``, ``route_cli`` and ``loadtest_cli``: the ``labkit serve``, ``labkit route`` and ``labkit loadtest``
  commands.

Nothing is imported here, so the load tester and the router never load torch or the model code (but for
``cache_aware``'s tokenizer: importing :mod:`labkit.models` brings torch).
"""
