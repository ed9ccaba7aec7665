"""One engine loop for every HTTP client: continuous batching across connections.

The engine is not thread-safe and needs no locks if one thread owns it. So one worker
thread runs the loop: take the requests that came in and the aborts, run one step, hand
each request's new tokens to the coroutine that serves its client, repeat; when nothing is
left it sleeps until a request comes. HTTP handlers never touch the engine: they put
commands on a queue and read outputs from their own :class:`Handle`, so a request that
arrives mid-run joins the very next step, exactly as in vLLM's ``AsyncLLM``. A step's outputs
reach the event loop together, in one ``call_soon_threadsafe`` (one wake-up per step, not one
per request): each wake-up costs the engine thread a write to the loop's self-pipe and a turn
of the GIL given to the event loop, time that no step runs in.

The loop also turns each request's tokens into text (:class:`~labkit.serve.text.TextStream`),
so a stop string ends the request right there, before another step runs, and the counters
count exactly the tokens the client is sent (as vLLM's output processor does), and the
decoding stays off the event loop. It notes how many of each request's prompt tokens the prefix cache
held when the request started (its ``usage``'s ``prompt_tokens_details.cached_tokens``, as OpenAI's API
reports it), and it feeds :class:`~labkit.serve.prometheus.ServerMetrics` from each step's record
(``llm.last_step``), so the counters stay whole however little of the run the engine's trace
keeps: a long-running server bounds its trace with the engine's ``trace_window`` setting
(``labkit serve`` sets one), and the engine's clock runs on from the server's start.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import math
import numbers
import queue
import statistics
import threading
import uuid
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, cast

from labkit.engine.request import RequestOutput
from labkit.kv.kv_events import KVEventLog
from labkit.sampling_params import SamplingParams
from labkit.serve.admission import AdmissionHook, QueueSnapshot
from labkit.serve.prometheus import FINISH_REASONS, ServerMetrics
from labkit.serve.protocol import APIError
from labkit.serve.text import TextStream

if TYPE_CHECKING:  # the engine loads torch; the worker only drives one it is handed
    from labkit.engine.llm import LLM

_STOP = None  # the command that ends the loop


def shutting_down() -> APIError:
    """What a request that arrives while the server drains is told."""
    return APIError(
        503,
        "The server is shutting down and takes no new requests; send this one again once it is back.",
        type="service_unavailable",
        code="server_shutting_down",
    )


TOKEN_WINDOW = 256  # the speed a drain reads is the median gap between two tokens of a request, over this many
SERVICE_WINDOW = 16  # the service time the admission hook sees is the median of this many finished requests


class Handle:
    """The HTTP side of one engine request: await its outputs and their text, or close it to abort it."""

    def __init__(self, worker: "EngineWorker", request_id: str, prompt_len: int, text: TextStream):
        self.worker = worker
        self.request_id = request_id
        self.prompt_len = prompt_len
        self.cached_tokens = 0  # prompt tokens its prefix cache held when it started (set by the loop thread)
        self.text = text  # updated by the loop thread only, before it pushes each output
        self._done = False  # the engine finished it, or it was closed
        self._loop = asyncio.get_running_loop()
        self._items: asyncio.Queue[tuple[RequestOutput, str] | APIError] = asyncio.Queue()

    def push(self, item: tuple[RequestOutput, str] | APIError) -> None:
        """From the worker thread: an output (or an error) for the coroutine awaiting it, handed over at
        the worker's next flush (:meth:`EngineWorker._flush`), in the order pushed."""
        self.worker._outbox.append((self, item))

    async def outputs(self) -> AsyncIterator[tuple[RequestOutput, str]]:
        """Each step's output for this request (all its tokens so far) and its new text, up to the finished one.

        The worker always ends a request's outputs with a finished one or an error (an abort
        sends one too), so this never waits for ever.
        """
        while True:
            item = await self._items.get()
            if isinstance(item, APIError):
                self._done = True
                raise item
            output = item[0]
            self._done = self._done or output.finished
            if output.finish_reason == "rejected":
                raise APIError(400, output.message or "The engine rejected the request.")
            yield item
            if output.finished:
                return

    def close(self, reason: str = "abort") -> None:
        """Done with it: if the engine is still working on it, abort it (``reason`` goes into the metrics)."""
        if not self._done:
            self._done = True
            self.worker.abort(self.request_id, reason)


@dataclass
class _Live:
    """What the loop keeps about a request it serves."""

    handle: Handle
    prompt_ids: list[int]
    params: SamplingParams
    arrival: float = 0.0  # on the engine clock
    scheduled_at: float | None = None
    last_token_at: float | None = None
    num_tokens: int = 0
    state: str = "queued"  # "queued" (accepted, not yet run), "running" (started), "gone" (finished or aborted)


class EngineWorker:
    """Owns the engine and runs its loop in a background thread."""

    def __init__(
        self, llm: LLM, metrics: ServerMetrics, max_waiting: int | None = None, admission: AdmissionHook | None = None
    ):
        if max_waiting is not None and max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1 (or None for no bound), got {max_waiting}")
        if admission is not None and not callable(admission):
            raise TypeError(f"admission must be a function of a QueueSnapshot, got {admission!r}")
        self.llm = llm
        self.metrics = metrics
        self.max_waiting = max_waiting
        self.admission = admission
        self.max_num_seqs = llm.config.max_num_seqs
        # the longest sequence one request may reach: max_model_len, or what the whole KV cache holds
        blocks = llm.state.blocks
        self.context_limit = min(llm.state.max_model_len, blocks.num_blocks * blocks.block_size + 1)
        self.tokenizer = llm.model.tokenizer  # what the HTTP side needs of the model, read once here
        self.vocab_size = llm.model.config.vocab_size
        self.error: str | None = None  # why the loop died, if it did
        self.draining = False  # set when the server stops: new requests are refused
        self.kv_events = _kv_event_log(llm)  # None: its pool publishes no prefix-cache events
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._live: dict[str, _Live] = {}  # touched by the loop thread only
        self._outbox: list[tuple[Handle, tuple[RequestOutput, str] | APIError]] = []  # loop thread only
        # the counts the admission hook sees, kept by both threads under the lock
        self._num_queued = 0
        self._num_running = 0
        self._service_s: deque[float] = deque(maxlen=SERVICE_WINDOW)  # start -> finish of recent requests
        self._token_s: deque[float] = deque(maxlen=TOKEN_WINDOW)  # seconds per token of a request, recent steps
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="labkit-engine-loop", daemon=True)

    # --- called from the event loop ------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    @property
    def healthy(self) -> bool:
        return self.error is None and self._thread.is_alive()

    def seconds_per_token(self) -> float | None:
        """The median time between two tokens of one request lately (its decode speed under the batch it ran
        in), or None before any request has had two tokens."""
        with self._lock:
            return statistics.median(self._token_s) if self._token_s else None

    def queue_snapshot(self) -> QueueSnapshot:
        """What a request arriving now would be shown: the queue, the batch, the recent service time."""
        with self._lock:
            return self._snapshot()

    def _snapshot(self) -> QueueSnapshot:  # with the lock held
        service_s = statistics.median(self._service_s) if self._service_s else None
        return QueueSnapshot(self._num_queued, self._num_running, self.max_num_seqs, service_s)

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, text: TextStream | None = None, request_id: str = ""
    ) -> Handle:
        """Hand a request to the loop; 503 with Retry-After if the queue is full or the admission hook says no."""
        if self.draining:
            raise shutting_down()
        if not self.healthy:
            raise APIError(
                503,
                f"The engine is not running ({self.error or 'stopped'}); restart the server.",
                type="service_unavailable",
            )
        with self._lock:
            if self.max_waiting is not None and self._num_queued >= self.max_waiting:
                raise APIError(
                    503,
                    f"The server has {self._num_queued} requests waiting (--max-waiting "
                    f"{self.max_waiting}); retry later.",
                    type="service_unavailable",
                    code="queue_full",
                    headers={"Retry-After": "1"},
                )
            if self.admission is not None:
                self._admit(self._snapshot())
            self._num_queued += 1
        text = text or TextStream(self.tokenizer)
        handle = Handle(self, request_id or f"cmpl-{uuid.uuid4().hex}", len(prompt_ids), text)
        self._commands.put(partial(self._add, _Live(handle, prompt_ids, params)))
        return handle

    def _admit(self, snapshot: QueueSnapshot) -> None:
        """Ask the admission hook; raise 503 + Retry-After if it refuses, 500 if its answer makes no sense."""
        assert self.admission is not None, "submit asks only when there is a hook"
        name = getattr(self.admission, "__name__", None) or repr(self.admission)
        try:
            seconds = self.admission(snapshot)
        except Exception as err:
            raise APIError(
                500,
                f"The admission hook {name} raised {type(err).__name__}: {err} (on {snapshot}).",
                type="internal_server_error",
                code="admission_hook_failed",
            ) from None
        if seconds is None:
            return
        # the cast: every numbers.Real compares like a float, though typeshed's Real declares no comparisons
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, numbers.Real)
            or not 0 <= cast(float, seconds) < math.inf
        ):
            raise APIError(
                500,
                f"The admission hook {name} returned {seconds!r} (on {snapshot}); it must return None to admit "
                "the request, or the seconds (a number >= 0) after which the client should retry.",
                type="internal_server_error",
                code="admission_hook_failed",
            )
        retry_s = int(math.ceil(seconds))
        raise APIError(
            503,
            f"The server predicts this request would wait too long to keep its promise ({snapshot.waiting} "
            f"waiting, {snapshot.running} running, max_num_seqs {snapshot.max_num_seqs}); retry in {retry_s} s.",
            type="service_unavailable",
            code="queue_too_long",
            headers={"Retry-After": str(retry_s)},
        )

    def abort(self, request_id: str, reason: str = "abort") -> None:
        self._commands.put(partial(self._abort, request_id, reason))

    def end_all(self, error: APIError) -> None:
        """End every request in the engine with ``error``, which each client is sent (its blocks are freed)."""
        self._commands.put(partial(self._end_all, error))

    async def reset_prefix_cache(self) -> bool:
        """Forget the prefix cache (in the loop's thread, between steps); False while a request holds blocks."""
        done: concurrent.futures.Future[bool] = concurrent.futures.Future()
        blocks = self.llm.state.blocks

        def reset() -> None:
            try:
                # not in the BlockAllocator protocol: an allocator of your own may lack it
                done.set_result(getattr(blocks, "reset_prefix_cache")())
            except Exception as err:  # an allocator of your own that cannot: the caller is told, the loop goes on
                done.set_exception(err)

        self._commands.put(reset)
        return await asyncio.wrap_future(done)

    def stop(self, timeout: float = 10.0) -> None:
        """End the loop: every request still in the engine is aborted and its client told why."""
        self._commands.put(_STOP)
        if self._thread.is_alive():
            self._thread.join(timeout)

    # --- the loop (worker thread) ----------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._take_commands(wait=not self.llm.has_unfinished()):
                self._flush()  # an engine's refusal or an abort's answer need not wait for the step
                if self.llm.has_unfinished():
                    self._step()
                    self._flush()
            self._end_all(APIError(503, "The server is shutting down.", type="service_unavailable"))
        except Exception as err:  # a broken policy or model: fail every client loudly, keep serving errors
            self.error = f"{type(err).__name__}: {err}"
            self._end_all(APIError(500, f"The engine failed: {self.error}", type="internal_server_error"))

    def _flush(self) -> None:
        """Hand every pushed item to its event loop: one wake-up per loop for the whole step, not one per
        request, so the engine thread does not trade the GIL with the event loop for each output."""
        if not self._outbox:
            return
        batches: dict[asyncio.AbstractEventLoop, list[tuple[Handle, tuple[RequestOutput, str] | APIError]]] = {}
        for handle, item in self._outbox:
            batches.setdefault(handle._loop, []).append((handle, item))
        self._outbox = []
        for loop, batch in batches.items():
            try:
                loop.call_soon_threadsafe(_hand_over, batch)
            except RuntimeError:  # the event loop is closed: nobody is waiting any more
                pass

    def _take_commands(self, wait: bool) -> bool:
        """Apply every queued command (blocking for the first if ``wait``); False once told to stop."""
        try:
            command = self._commands.get(block=wait)
        except queue.Empty:
            return True
        while command is not _STOP:
            command()
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True
        return False

    def _add(self, live: _Live) -> None:
        request_id = live.handle.request_id
        live.arrival = self.llm.now()
        try:
            self.llm.add_request(live.prompt_ids, live.params, request_id=request_id)
        except ValueError as err:  # the engine's own checks, should the server's have let something by
            self._forget(live)
            live.handle.push(APIError(400, str(err)))
            return
        self._live[request_id] = live

    def _abort(self, request_id: str, reason: str) -> None:
        live = self._live.pop(request_id, None)
        if live is None:
            return  # it finished before the abort came
        self.llm.abort_request(request_id)
        now = self.llm.now()
        if reason != "abort":  # the client ended it because its answer was complete (a stop string)
            self._record_service(live, now)
        self._forget(live)
        self._count_finished(live, reason, now)
        live.handle.push(APIError(499, "The request was aborted."))
        if not self.llm.has_unfinished():
            self.metrics.on_idle()

    def _step(self) -> None:
        outputs = self.llm.step()
        record = self.llm.last_step
        now = self.llm.now()
        if record is not None:
            now = record.end  # the time the engine stamped on this step's tokens
            for request_id, num_new in record.scheduled.items():
                live = self._live.get(request_id)
                if live is not None and live.scheduled_at is None:
                    live.scheduled_at = record.start
                    live.handle.cached_tokens = self._computed(request_id, live) - num_new
                    self._start(live)
            self.metrics.on_step(record)
        for output in outputs:
            live = self._live.get(output.request_id)
            if live is not None:
                self._deliver(live, output, now)
        if not self.llm.has_unfinished():
            self.metrics.on_idle()

    def _deliver(self, live: _Live, output: RequestOutput, now: float) -> None:
        text = live.handle.text
        piece = text.update(output.token_ids, output.finished)
        if text.stopped and not output.finished:  # a stop string: the answer ends here, before another step
            self.llm.abort_request(output.request_id)
            output = replace(output, finished=True, finish_reason="stop")
        num_new = len(output.token_ids) - live.num_tokens
        if num_new > 0:
            first = now - live.arrival if live.num_tokens == 0 else None
            gaps = [] if live.last_token_at is None else [now - live.last_token_at]
            self.metrics.on_tokens(live.handle.prompt_len, num_new, first, gaps)
            if gaps:
                with self._lock:
                    self._token_s.append(gaps[0] / num_new)
            live.num_tokens, live.last_token_at = len(output.token_ids), now
        if output.finished:
            del self._live[output.request_id]
            if output.finish_reason in ("stop", "length"):
                self._record_service(live, now)
            self._forget(live)
            if output.finish_reason in FINISH_REASONS:
                self._count_finished(live, output.finish_reason, now)
        live.handle.push((output, piece))

    def _computed(self, request_id: str, live: _Live) -> int:
        """Tokens of a request computed after the step that started it: those it found cached, then the step's.
        One that finished in that step had its whole prompt computed (its first token came from the last one)."""
        request = self.llm.state.requests.get(request_id)
        return request.num_computed_tokens if request is not None else len(live.prompt_ids)

    def _start(self, live: _Live) -> None:
        """Its first step: it leaves the queue and takes a seat."""
        if live.state == "queued":
            with self._lock:
                self._num_queued -= 1
                self._num_running += 1
            live.state = "running"

    def _forget(self, live: _Live) -> None:
        """It is over (finished, aborted, rejected): it counts as neither waiting nor running."""
        with self._lock:
            if live.state == "queued":
                self._num_queued -= 1
            elif live.state == "running":
                self._num_running -= 1
        live.state = "gone"

    def _count_finished(self, live: _Live, reason: str, now: float) -> None:
        """The metrics count it ended for ``reason``, with its latencies and lengths."""
        queue_s = None if live.scheduled_at is None else live.scheduled_at - live.arrival
        self.metrics.on_finish(reason, now - live.arrival, queue_s, live.handle.prompt_len, live.num_tokens)

    def _record_service(self, live: _Live, now: float) -> None:
        """How long it held its seat, for the admission hook's ``service_s``."""
        if live.scheduled_at is not None:
            with self._lock:
                self._service_s.append(now - live.scheduled_at)

    def _end_all(self, error: APIError) -> None:
        for request_id, live in list(self._live.items()):
            if self.error is None:
                self.llm.abort_request(request_id)
                self._count_finished(live, "abort", self.llm.now())
            self._forget(live)
            live.handle.push(error)
        self._live.clear()
        self.metrics.on_idle()
        self._flush()


def _kv_event_log(llm: LLM) -> KVEventLog | None:
    """A log of the engine's prefix-cache events, or None where prefix caching is off or its pool publishes none
    (an allocator of your own without ``publish_events``)."""
    blocks = llm.state.blocks
    publish_events = getattr(blocks, "publish_events", None)  # not in the BlockAllocator protocol
    if not llm.state.enable_prefix_caching or not callable(publish_events):
        return None
    log = KVEventLog(blocks.block_size)
    publish_events(log.publish)
    return log


def _hand_over(batch: list[tuple[Handle, tuple[RequestOutput, str] | APIError]]) -> None:
    """On the event loop: one step's outputs (or errors) into their handles' queues, in order."""
    for handle, item in batch:
        handle._items.put_nowait(item)
