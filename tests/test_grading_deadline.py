"""One wall-clock deadline per submission, restarts, setup and replays included (issue 34.2).

What the numbers prove: the hanging cell blocks for ever (a sleep of 30 years) and its own cell
timeout is 10,000 s, so only the session's 20 s deadline can stop it; the test allows the session
300 s, 15x the deadline for kernel starts on a busy machine and still 30x under what the cell
timeout alone would allow. No verdict races a timer.
"""

from __future__ import annotations

import time

from labkit.grading import kernel_session as ks

FOREVER = "import time\ntime.sleep(10**9)"


def test_the_deadline_holds_across_a_restart_and_stops_what_comes_after(tmp_path):
    started = time.monotonic()
    with ks.KernelSession(
        tmp_path,
        cell_timeout=10_000,
        notebook_budget=10_000,
        wall_clock_limit=20,
    ) as session:
        outcomes = [
            session.run_notebook_cell(source) for source in ("x = 1", "import os\nos._exit(1)", FOREVER, "y = 2")
        ]
        after = session.run_grader_code("z = 3")
    elapsed = time.monotonic() - started
    assert [outcome.status for outcome in outcomes] == [ks.RAN, ks.DIED, ks.TIMED_OUT, ks.SKIPPED], outcomes
    assert session.restarts == 1
    assert "wall-clock limit (20 s)" in outcomes[3].detail and after.status == ks.SKIPPED
    assert elapsed < 300, f"the session ran {elapsed:.0f} s past a 20 s deadline"


def test_a_fresh_kernel_sees_nothing_an_earlier_one_planted(tmp_path):
    """A startup file in the IPython directory, a module in the working folder: neither reaches the next kernel."""
    plant = (
        "import os, IPython\n"
        "startup = os.path.join(IPython.paths.get_ipython_dir(), 'profile_default', 'startup')\n"
        "os.makedirs(startup, exist_ok=True)\n"
        "open(os.path.join(startup, '00.py'), 'w').write('planted = True')\n"
        "open('shadow_me.py', 'w').write('planted = True')\n"
    )
    with ks.KernelSession(tmp_path, cell_timeout=60, notebook_budget=600) as session:
        assert session.run_notebook_cell(plant).status == ks.RAN
        assert session.run_notebook_cell("import os\nos._exit(1)").status == ks.DIED
        seen = session.run_notebook_cell(
            "import importlib.util\n"
            "assert 'planted' not in globals(), 'the startup file ran'\n"
            "assert importlib.util.find_spec('shadow_me') is None, 'the working folder is on sys.path'\n"
        )
    assert (tmp_path / "shadow_me.py").exists()
    assert seen.status == ks.RAN, seen.detail
