"""The notebook client waits in one-second polls: a missed wake-up costs a second, not the cell's timeout.

Why: on a busy machine nbclient's one long poll per socket sometimes sleeps through a message that
has arrived, until its timeout (lab 2 took 11 minutes instead of one beside two busy processes). The
fake channels here stand for the socket: each poll lasts the timeout it is given, as a poll that
misses its wake-up does, and then finds whatever has arrived.
"""

from __future__ import annotations

import asyncio
from queue import Empty

import nbformat
import pytest

from labkit.grading.steady_client import SteadyNotebookClient, in_slices


class SleepyChannel:
    """A socket whose polls never wake early: each lasts its whole timeout, then sees what has arrived."""

    def __init__(self, message_after_polls: int | None):
        self.message_after_polls = message_after_polls
        self.timeouts: list[float | None] = []

    async def get_msg(self, timeout: float | None = None) -> dict:
        self.timeouts.append(timeout)
        await asyncio.sleep(timeout or 0)
        if self.message_after_polls is not None and len(self.timeouts) >= self.message_after_polls:
            return {"msg_type": "execute_reply"}
        raise Empty


def test_a_message_is_found_at_the_next_slice_however_long_the_timeout():
    channel = SleepyChannel(message_after_polls=3)
    message = asyncio.run(in_slices(channel.get_msg, slice_s=0.01)(timeout=600))
    assert message == {"msg_type": "execute_reply"}
    assert channel.timeouts == [0.01, 0.01, 0.01], "each poll lasts a slice, and the first that finds it returns"


def test_no_timeout_means_polling_in_slices_until_a_message_comes():
    channel = SleepyChannel(message_after_polls=5)
    assert asyncio.run(in_slices(channel.get_msg, slice_s=0.01)(timeout=None)) == {"msg_type": "execute_reply"}
    assert channel.timeouts == [0.01] * 5


def test_the_deadline_still_holds_and_ends_in_empty():
    channel = SleepyChannel(message_after_polls=None)
    with pytest.raises(Empty):
        asyncio.run(in_slices(channel.get_msg, slice_s=0.02)(timeout=0.05))
    assert all(t is not None and t <= 0.02 for t in channel.timeouts), channel.timeouts
    assert sum(channel.timeouts) <= 0.05 + 1e-9, "no poll reaches past the deadline it was given"
    assert len(channel.timeouts) >= 3, "it polled until the deadline, not once"


@pytest.mark.parametrize("path", ["execute", "setup_kernel"])
def test_a_real_kernel_is_driven_through_sliced_polls(path):
    """Both ways nbclient starts a client (execute() and the blocking setup_kernel()) get the sliced polls."""
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    client = SteadyNotebookClient(notebook, timeout=60, kernel_name="python3")
    polls = []
    client.on_cell_start = lambda **_: polls.extend(
        channel.get_msg.__name__ for channel in (client.kc.shell_channel, client.kc.iopub_channel)
    )
    if path == "execute":
        client.execute()
    else:
        with client.setup_kernel():
            client.execute_cell(notebook.cells[0], 0)
    assert polls == ["get_msg_in_slices"] * 2
    assert notebook.cells[0].outputs[0]["text"] == "42\n"
