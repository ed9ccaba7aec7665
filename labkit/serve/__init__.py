"""Serving for real: an OpenAI-compatible HTTP server over the engine, and a load tester for any such server.

- :mod:`~labkit.serve.protocol`: OpenAI request validation and response shapes, errors included;
- :mod:`~labkit.serve.text`: token ids to streamed text, with stop strings;
- :mod:`~labkit.serve.worker`: the one thread that runs the engine loop for every HTTP client;
- :mod:`~labkit.serve.admission`: admission control, 503 + Retry-After when a request would wait past the promise
  (labkit's own: vLLM queues every request);
- :mod:`~labkit.serve.metrics`: Prometheus metrics with vLLM's names and buckets;
- :mod:`~labkit.serve.app`: the routes (starlette), auth and size limits;
- :mod:`~labkit.serve.server`: uvicorn running the app, in the foreground or in a thread (tests, notebooks);
- :mod:`~labkit.serve.loadtest`: ``vllm bench serve``'s job with the ``openai`` client;
- :mod:`~labkit.serve.background` and :mod:`~labkit.serve.watch`: a server, loads and scrapes from a notebook,
  with a live plot of the gauges while a load runs;
- ``serve_cli`` and ``loadtest_cli``: the ``labkit serve`` and ``labkit loadtest`` commands.

Nothing is imported here, so the load tester never loads torch or the model code.
"""
