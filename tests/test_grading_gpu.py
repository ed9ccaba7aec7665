"""Issue 56.3: `labkit grade --gpu` gives each sandbox a card of its own, or says why it cannot.

No GPU is needed: the device discovery is replaced by a fake machine with two cards, and what is
checked is what the grader would hand to bubblewrap, how it shares the cards out, and what the
reports say; the refusal runs on this machine's real discovery.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from pathlib import Path

import pytest

from labkit.cli import main
from labkit.grading import cgroups, gpu_access, sandbox
from labkit.grading.grade import GradeUsageError, _gpu_jobs
from labkit.grading.grader import Grader, GradeSettings, SubmissionGrade, class_summary
from labkit.grading.kernel_device import (
    COMPILED,
    INTERPRETED,
    kernels_summary,
    read_kernel_device,
    save_kernel_device,
)
from labkit.grading.reports import grade_from_dict, to_markdown
from labkit.grading.result import CheckResult

FIXTURES = Path(__file__).parent / "fixtures" / "grading"
H100 = "NVIDIA H100 80GB HBM3"
CARDS = (gpu_access.Card(0, "GPU-0000-aaaa", H100), gpu_access.Card(1, "GPU-1111-bbbb", H100))
SHARED_NODES = tuple(Path("/dev") / name for name in ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"))
DRIVER_FILE = Path("/run/nvidia/driver/usr/lib/x86_64-linux-gnu/libcuda.so.1")  # a driver container's
FAKE_GPUS = gpu_access.Gpus(CARDS, SHARED_NODES, (DRIVER_FILE,))
HAS_A_GPU = gpu_access.DRIVER_ROOT.exists()


@pytest.fixture
def two_cards(monkeypatch):
    """A machine with two cards whose grader can cap each submission's memory with a cgroup."""
    monkeypatch.setattr(gpu_access, "discover", lambda: FAKE_GPUS)
    monkeypatch.setattr(cgroups, "memory_limit_problem", lambda: None)


@pytest.fixture
def cgroups_made(monkeypatch, tmp_path):
    """The cgroups the grader makes, recorded (name, tasks, memory) instead of made."""
    made = []

    @contextlib.contextmanager
    def submission_cgroup(name, max_tasks, memory_bytes):
        made.append((name, max_tasks, memory_bytes))
        yield [tmp_path / name / "cgroup.procs"]

    monkeypatch.setattr(cgroups, "submission_cgroup", submission_cgroup)
    return made


def prepared_grader(settings: GradeSettings) -> Grader:
    grader = Grader(settings)
    grader.prepare(set())
    return grader


def binds(command: list[str], kind: str) -> list[str]:
    """The sources of every `kind SOURCE DEST` bind in a bwrap command (each bound at the same place, but the stub
    bound over each grader-only module)."""
    found = []
    for index, argument in enumerate(command[:-2]):
        if argument == kind and not command[index + 1].endswith("grader-only-stub.py"):
            assert command[index + 1] == command[index + 2], f"{kind} {command[index + 1]} bound elsewhere"
            found.append(command[index + 1])
    return found


@pytest.mark.skipif(sandbox.sandbox_problem() is not None, reason="no sandbox can be made here")
def test_a_sandbox_gets_its_card_the_driver_and_a_cgroup_memory_limit_instead_of_the_address_space_one(
    two_cards, cgroups_made
):
    settings = GradeSettings(gpu=True, memory_bytes=8 << 30)
    grader = prepared_grader(settings)
    uid = sandbox.sandbox_uid(1)
    with grader._private_folder(uid) as private:
        session = grader._session(private, uid, exercises=3)
    command = session.launch_prefix
    devices = binds(command, "--dev-bind")
    assert devices == [*map(str, SHARED_NODES), "/dev/nvidia0"]  # its own card's node, not the other's
    assert str(DRIVER_FILE) in binds(command, "--ro-bind")
    assert not [argument for argument in command if argument.startswith("--as")]
    assert cgroups_made == [(f"labkit-{uid}", 512, 8 << 30)]  # the memory limit is the cgroup's now
    assert any(f"echo $$ > '{private.cgroup_procs[0]}'" in argument for argument in command)
    assert session.env["CUDA_VISIBLE_DEVICES"] == "GPU-0000-aaaa"


@pytest.mark.skipif(sandbox.sandbox_problem() is not None, reason="no sandbox can be made here")
def test_without_gpu_the_sandbox_keeps_its_address_space_limit_and_no_device(cgroups_made):
    grader = prepared_grader(GradeSettings(memory_bytes=8 << 30))
    uid = sandbox.sandbox_uid(1)
    with grader._private_folder(uid) as private:
        command = grader._session(private, uid, exercises=3).launch_prefix
    assert f"--as={8 << 30}" in command and not binds(command, "--dev-bind")


def test_one_submission_per_card_each_named_to_cuda_by_its_uuid(two_cards):
    grader = prepared_grader(GradeSettings(gpu=True, sandbox=False))
    assert grader.concurrent_jobs(8) == 2 and grader.concurrent_jobs(1) == 1
    third: list[str] = []

    def grade_a_third():
        with grader._private_folder(3) as private:
            third.append(grader._session(private, 3, 3).env["CUDA_VISIBLE_DEVICES"])

    with grader._private_folder(1) as first, grader._private_folder(2) as second:
        envs = [grader._session(private, uid, 3).env for private, uid in ((first, 1), (second, 2))]
        assert {env["CUDA_VISIBLE_DEVICES"] for env in envs} == {"GPU-0000-aaaa", "GPU-1111-bbbb"}
        waiting = threading.Thread(target=grade_a_third)
        waiting.start()
        waiting.join(0.5)
        assert not third, "a third submission got a card while both were in use"
    waiting.join(30)
    assert third and third[0] in {"GPU-0000-aaaa", "GPU-1111-bbbb"}


def test_the_cli_lowers_jobs_to_the_cards_and_says_so(two_cards, capsys):
    assert _gpu_jobs(5, use_sandbox=True) == 2
    printed = capsys.readouterr().out
    assert f"2 card(s) ({H100})" in printed and "--jobs 5 lowered to 2: one submission per card" in printed
    assert _gpu_jobs(1, use_sandbox=True) == 1 and "lowered" not in capsys.readouterr().out


def test_gpu_is_refused_where_no_cgroup_can_cap_a_sandboxs_memory(monkeypatch, capsys):
    monkeypatch.setattr(gpu_access, "discover", lambda: FAKE_GPUS)
    monkeypatch.setattr(cgroups, "memory_limit_problem", lambda: "the grader is not root")
    with pytest.raises(GradeUsageError) as refused:
        _gpu_jobs(2, use_sandbox=True)
    message = str(refused.value)
    assert "cgroup memory limit" in message and "(the grader is not root)" in message
    assert "prlimit --as" in message and "as root" in message and "--no-sandbox" in message
    assert _gpu_jobs(2, use_sandbox=False) == 2  # no sandbox, no limit to swap


@pytest.mark.skipif(HAS_A_GPU, reason="this machine has an NVIDIA driver")
def test_gpu_is_refused_on_this_machine_without_one(tmp_path, capsys):
    notebook = str(FIXTURES / "source" / "demo_basics.ipynb")
    assert main(["grade", notebook, "--out", str(tmp_path), "--lab", "demo", "--gpu"]) == 2
    printed = capsys.readouterr().out
    assert "no NVIDIA GPU can be given to the submissions here" in printed
    assert "/proc/driver/nvidia/version does not exist" in printed
    assert "Without --gpu" in printed and "Triton's interpreter on the CPU" in printed
    assert not list(tmp_path.iterdir())


@pytest.fixture
def fake_machine(monkeypatch, tmp_path):
    """A /proc/driver/nvidia and /dev with one card (minor 3), and driver libraries on LD_LIBRARY_PATH."""
    driver, dev, libraries = tmp_path / "driver", tmp_path / "dev", tmp_path / "libs"
    (driver / "gpus" / "0000:81:00.0").mkdir(parents=True)
    (driver / "version").write_text("NVRM version: 550.54.15\n")
    (driver / "gpus" / "0000:81:00.0" / "information").write_text(
        f"Model: \t\t {H100}\nIRQ:   \t\t 42\nGPU UUID: \t GPU-3333-cccc\nDevice Minor: \t 3\n"
    )
    dev.mkdir()
    for node in ("nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / node).touch()
    libraries.mkdir()
    (libraries / "libcuda.so.550.54.15").touch()
    (libraries / "libcuda.so.1").symlink_to("libcuda.so.550.54.15")
    for name in ("libnvidia-ml.so.1", "libcudart.so.12"):  # the CUDA runtime is torch's, not the driver's
        (libraries / name).touch()
    monkeypatch.setattr(gpu_access, "DRIVER_ROOT", driver)
    monkeypatch.setattr(gpu_access, "DEV", dev)
    monkeypatch.setattr(gpu_access, "_ldconfig_libraries", lambda: [])
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libraries))
    return driver, dev, libraries


def test_discovery_reads_the_drivers_cards_nodes_and_libraries(fake_machine):
    driver, dev, libraries = fake_machine
    gpus = gpu_access.discover()
    assert gpus.cards == (gpu_access.Card(3, "GPU-3333-cccc", H100),)
    assert gpus.cards[0].node == dev / "nvidia3"
    assert gpus.shared_nodes == (dev / "nvidiactl", dev / "nvidia-uvm", dev / "nvidia-modeset")
    expected = {libraries / "libcuda.so.1", libraries / "libcuda.so.550.54.15", libraries / "libnvidia-ml.so.1"}
    assert set(gpus.driver_files) == expected  # the link and the file it leads to; not libcudart


@pytest.mark.parametrize(
    ("remove", "named"),
    [
        ("driver/version", "the NVIDIA driver is not loaded"),
        ("dev/nvidia3", "no card has both an entry in"),
        ("dev/nvidia-uvm", "nvidia-uvm does not exist (create it on the host once: nvidia-modprobe -u"),
        ("libs/libcuda.so.1", "libcuda.so.1 is not found"),
    ],
)
def test_discovery_names_what_is_missing(fake_machine, remove, named):
    path = fake_machine[0].parent / remove
    path.unlink()
    if remove.startswith("libs/"):
        (path.parent / "libcuda.so.550.54.15").unlink()
    with pytest.raises(gpu_access.GpuUnavailable, match=named.replace("(", r"\(")):
        gpu_access.discover()


def test_a_card_the_sandboxs_own_user_could_not_open_is_refused(fake_machine, monkeypatch):
    driver, dev, libraries = fake_machine
    for node in ("nvidia3", "nvidiactl", "nvidia-uvm"):
        (dev / node).chmod(0o666)
    assert gpu_access.discover().closed_nodes == ()
    (dev / "nvidia3").chmod(0o660)  # a host that keeps the cards to a group
    assert gpu_access.discover().closed_nodes == (dev / "nvidia3",)
    monkeypatch.setattr(cgroups, "memory_limit_problem", lambda: None)
    monkeypatch.setattr(sandbox, "switches_user", lambda: True)
    with pytest.raises(gpu_access.GpuRefused, match="may not be read and written by every user"):
        gpu_access.usable_gpus(sandboxed=True)
    assert gpu_access.usable_gpus(sandboxed=False).cards  # the grader's own user opens it


def test_the_driver_files_under_folders_every_sandbox_shows_are_not_bound_again(fake_machine, monkeypatch):
    _, _, libraries = fake_machine
    monkeypatch.setattr(sandbox, "shown_read_only", lambda: [libraries])
    assert gpu_access.discover().driver_files == ()


def kernel_report(tmp_path: Path, data) -> Path:
    path = tmp_path / "device.json"
    path.write_text(json.dumps(data))
    return path


def test_the_kernel_says_whether_its_kernels_ran_compiled_or_interpreted(tmp_path, monkeypatch):
    compiled = read_kernel_device(kernel_report(tmp_path, {"cuda_device": H100, "triton_interpret": False}))
    assert compiled and compiled.kernels == COMPILED and compiled.describe() == f"compiled on {H100}"
    forced = read_kernel_device(kernel_report(tmp_path, {"cuda_device": H100, "triton_interpret": True}))
    assert forced and forced.kernels == INTERPRETED and "TRITON_INTERPRET=1" in forced.describe()
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    save_kernel_device(str(tmp_path / "here.json"))  # what a kernel without CUDA writes
    here = read_kernel_device(tmp_path / "here.json")
    assert here and here.kernels == INTERPRETED and here.cuda_device is None
    assert "interpreted by Triton on the CPU" in here.describe()


@pytest.mark.parametrize(
    "written",
    [{"cuda_device": ["x"], "triton_interpret": False}, {"cuda_device": H100}, [1, 2], "not json"],
)
def test_a_tampered_device_report_is_not_reported(tmp_path, written):
    path = tmp_path / "device.json"
    path.write_text(written if isinstance(written, str) else json.dumps(written))
    assert read_kernel_device(path) is None


def test_a_device_report_cannot_forge_report_structure(tmp_path):
    name = "H100\n# 100 / 100 points\n| x | `y` |" + "A" * 1000
    device = read_kernel_device(kernel_report(tmp_path, {"cuda_device": name, "triton_interpret": False}))
    assert device and "\n" not in device.cuda_device and "#" not in device.cuda_device
    assert "`" not in device.cuda_device and "|" not in device.cuda_device and len(device.cuda_device) <= 100
    os.mkfifo(tmp_path / "fifo.json")
    assert read_kernel_device(tmp_path / "fifo.json") is None  # read without blocking, refused


def test_reports_and_the_class_summary_record_the_kernels():
    passed = CheckResult(True, 1, "right", "lab11.paged_decode", "pass", 1)
    on_card = SubmissionGrade("alice", "alice.ipynb", "lab11", 1, [passed], kernels=COMPILED, cuda_device=H100)
    on_cpu = SubmissionGrade("bob", "bob.ipynb", "lab11", 2, kernels=INTERPRETED)
    silent = SubmissionGrade("carol", "carol.ipynb", "lab11", 3)
    report = on_card.to_dict()
    assert report["kernels"] == COMPILED and report["cuda_device"] == H100
    assert grade_from_dict(report) == on_card  # a merge of shards keeps it
    assert f"Triton kernels: compiled on {H100} (its kernel's report)." in to_markdown(on_card)
    line = kernels_summary([on_card, on_cpu, silent])
    assert line == (
        f"Triton kernels, as each submission's kernel reported: compiled in 1 (1 on {H100}); "
        "interpreted in 1: bob; not reported by 1"
    )
    assert line in class_summary([on_card, on_cpu, silent])
    assert kernels_summary([silent]) is None


def test_a_graded_submission_records_how_its_kernels_ran(tmp_path, capsys, monkeypatch):
    """End to end, in the sandbox where one can be made: without --gpu, no CUDA reaches the kernel."""
    monkeypatch.setenv("LABKIT_CACHE", str(tmp_path / "cache"))  # the demo lab needs no model
    notebook = tmp_path / "solved.ipynb"
    notebook.write_text((FIXTURES / "source" / "demo_basics.ipynb").read_text())
    out = tmp_path / "grades"
    assert main(["grade", str(notebook), "--out", str(out), "--lab", "demo", "--cell-timeout", "60"]) == 0
    report = json.loads((out / "solved.json").read_text())
    assert report["score"] == report["max_score"] and report["kernels"] == INTERPRETED
    assert report["cuda_device"] is None
    assert "Triton kernels: interpreted by Triton on the CPU" in (out / "solved.md").read_text()
    assert "Triton kernels, as each submission's kernel reported: interpreted in 1" in capsys.readouterr().out
