"""A card of its own for each sandboxed kernel: the NVIDIA device nodes and driver files CUDA needs.

A sandbox's fresh /dev has no /dev/nvidia*, so without this every submission's Triton kernels run
in the interpreter even on a GPU host. `labkit grade --gpu` gives each submission's sandbox
(bubblewrap's `--dev-bind`) the nodes every CUDA process opens (/dev/nvidiactl, /dev/nvidia-uvm,
/dev/nvidia-uvm-tools, /dev/nvidia-modeset, and /dev/nvidia-caps where MIG made it) and its own
card's /dev/nvidiaN alone, and names that card in CUDA_VISIBLE_DEVICES by its UUID (CUDA's own
device order need not follow the nodes' numbers). A card serves one submission at a time
(`CardPool`). The driver's user-space libraries (libcuda.so*, libnvidia-*.so*), found where the
dynamic loader finds them (`ldconfig -p`, LD_LIBRARY_PATH), are bound read-only where they lie
outside the folders every sandbox shows already (/usr, /lib, ...; a driver container's
/run/nvidia/driver is not). /proc/driver/nvidia comes with the sandbox's own /proc; /dev/dri is
left out, since CUDA does not use it.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from labkit.grading import cgroups, sandbox

DRIVER_ROOT = Path("/proc/driver/nvidia")  # the driver's own files: `version`, and gpus/BUS/information per card
DEV = Path("/dev")
REQUIRED_NODES = ("nvidiactl", "nvidia-uvm")  # without them CUDA cannot start
OPTIONAL_NODES = ("nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")  # bound where the driver made them
_DRIVER_LIBRARY = re.compile(r"(libcuda|libcudadebugger|libnvidia-[\w.-]+?)\.so(\.[\d.]+)?")


class GpuUnavailable(Exception):
    """No card can be given to the sandboxes here; the message names what is missing."""


class GpuRefused(Exception):
    """`labkit grade --gpu` cannot run here; the message says why and what to do instead."""


@dataclass(frozen=True)
class Card:
    """One NVIDIA card, as its driver lists it."""

    minor: int  # N of its device node /dev/nvidiaN
    uuid: str  # GPU-..., what CUDA_VISIBLE_DEVICES names it by
    model: str  # e.g. "NVIDIA H100 80GB HBM3"

    @property
    def node(self) -> Path:
        return DEV / f"nvidia{self.minor}"


@dataclass(frozen=True)
class Gpus:
    """What the sandboxes need to use this machine's cards."""

    cards: tuple[Card, ...]
    shared_nodes: tuple[Path, ...]  # device nodes every CUDA process opens, whichever card it uses
    driver_files: tuple[Path, ...]  # the driver's libraries that no sandbox shows otherwise
    closed_nodes: tuple[Path, ...] = ()  # nodes not every user may read and write (a sandbox's own user cannot)


def _field(text: str, key: str) -> str | None:
    match = re.search(rf"^{re.escape(key)}:\s*(.+?)\s*$", text, re.MULTILINE)
    return match.group(1) if match else None


def _cards() -> tuple[Card, ...]:
    """The cards the driver lists that have a device node, from /proc/driver/nvidia/gpus/BUS/information."""
    cards = []
    for information in sorted((DRIVER_ROOT / "gpus").glob("*/information")):
        text = information.read_text(errors="replace")
        minor, uuid, model = _field(text, "Device Minor"), _field(text, "GPU UUID"), _field(text, "Model")
        if minor and minor.isdigit() and uuid and uuid.startswith("GPU-"):
            card = Card(int(minor), uuid, model or "an NVIDIA GPU")
            if card.node.exists():
                cards.append(card)
    return tuple(sorted(cards, key=lambda card: card.minor))


def _ldconfig_libraries() -> list[Path]:
    """The driver libraries the loader's cache lists (`ldconfig -p`)."""
    ldconfig = next((tool for tool in (shutil.which("ldconfig"), "/sbin/ldconfig", "/usr/sbin/ldconfig") if tool), None)
    if ldconfig is None or not os.path.exists(ldconfig):
        return []
    try:
        listing = subprocess.run([ldconfig, "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    libraries = []
    for line in listing.splitlines():
        name, arrow, path = line.strip().partition(" => ")
        if arrow and _DRIVER_LIBRARY.fullmatch(name.split(" ", 1)[0]):
            libraries.append(Path(path))
    return libraries


def driver_libraries() -> list[Path]:
    """Every driver library the loader can find: its cache's, and those in LD_LIBRARY_PATH's folders."""
    found = _ldconfig_libraries()
    for folder in filter(None, os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)):
        if os.path.isdir(folder):
            found += [path for path in Path(folder).iterdir() if _DRIVER_LIBRARY.fullmatch(path.name)]
    return list(dict.fromkeys(path for path in found if path.exists()))


def _not_shown(paths: Sequence[Path]) -> tuple[Path, ...]:
    """The paths (and the files their links lead to) that no sandbox shows without a bind of their own."""
    shown = sandbox.shown_read_only()
    needed = dict.fromkeys(path for named in paths for path in (named.absolute(), named.resolve()))
    return tuple(path for path in needed if not any(path.is_relative_to(folder) for folder in shown))


def discover() -> Gpus:
    """This machine's cards, with the device nodes and driver files a sandbox needs to use them;
    GpuUnavailable (naming what is missing) where there is none to use."""
    if not (DRIVER_ROOT / "version").is_file():
        raise GpuUnavailable(f"the NVIDIA driver is not loaded here ({DRIVER_ROOT / 'version'} does not exist)")
    cards = _cards()
    if not cards:
        raise GpuUnavailable(
            f"no card has both an entry in {DRIVER_ROOT / 'gpus'} and its device node {DEV}/nvidia0, ..."
        )
    missing = [str(DEV / name) for name in REQUIRED_NODES if not (DEV / name).exists()]
    if missing:
        raise GpuUnavailable(
            f"{', '.join(missing)} does not exist (create it on the host once: nvidia-modprobe -u -c=0, or run nvidia-smi)"
        )
    libraries = driver_libraries()
    if not any(path.name.startswith("libcuda.so") for path in libraries):
        raise GpuUnavailable(
            "the driver's libcuda.so.1 is not found (neither `ldconfig -p` nor LD_LIBRARY_PATH has it)"
        )
    shared = tuple(DEV / name for name in (*REQUIRED_NODES, *OPTIONAL_NODES) if (DEV / name).exists())
    needed = [DEV / name for name in REQUIRED_NODES] + [card.node for card in cards]
    closed = tuple(node for node in needed if node.stat().st_mode & 0o006 != 0o006)
    return Gpus(cards, shared, _not_shown(libraries), closed)


@dataclass(frozen=True)
class CardAccess:
    """One card as one submission gets it: the binds that show it (and the driver) to its sandbox,
    and the environment that names it to CUDA."""

    card: Card
    binds: tuple[tuple[str, Path], ...]  # the shared nodes and this card's (devices usable), driver files (read-only)

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_VISIBLE_DEVICES": self.card.uuid}


def card_access(gpus: Gpus, card: Card) -> CardAccess:
    """What gives a sandbox `card` alone: of the card nodes, only its own."""
    nodes = [("--dev-bind", node) for node in (*gpus.shared_nodes, card.node)]
    return CardAccess(card, (*nodes, *(("--ro-bind", path) for path in gpus.driver_files)))


class CardPool:
    """The run's cards, each handed to one submission at a time: `take()` waits until one is free."""

    def __init__(self, gpus: Gpus) -> None:
        self._free: queue.Queue[CardAccess] = queue.Queue()
        for card in gpus.cards:
            self._free.put(card_access(gpus, card))
        self.size = len(gpus.cards)

    @contextmanager
    def take(self) -> Iterator[CardAccess]:
        access = self._free.get()
        try:
            yield access
        finally:
            self._free.put(access)


def usable_gpus(sandboxed: bool) -> Gpus:
    """The cards `labkit grade --gpu` hands out, once it knows that it can (for sandboxes: that a cgroup
    limits each one's memory); GpuRefused, saying why and what to do, where it cannot."""
    try:
        gpus = discover()
    except GpuUnavailable as error:
        raise GpuRefused(
            f"--gpu: no NVIDIA GPU can be given to the submissions here: {error}.\n"
            "Without --gpu the submissions are graded all the same, lab 11's kernels by Triton's interpreter "
            "on the CPU (correct, only slower)."
        ) from None
    if sandboxed and (problem := cgroups.memory_limit_problem()):
        raise GpuRefused(
            f"--gpu needs a cgroup memory limit for each submission, and none can be set here ({problem}).\n"
            "A sandboxed kernel's memory is otherwise bounded by an address-space limit (prlimit --as), under "
            "which CUDA cannot start: it reserves far more address space than it uses.\n"
            "Fix: run labkit grade as root on a machine whose cgroup tree it can write (cgroup v1's memory "
            "controller or v2), or pass --no-sandbox on a trusted throwaway machine (then nothing limits a "
            "submission, and each one can read and change the others' work)."
        )
    if sandboxed and sandbox.switches_user() and gpus.closed_nodes:
        raise GpuRefused(
            f"--gpu: {', '.join(map(str, gpus.closed_nodes))} may not be read and written by every user, so a "
            "sandbox's own user could not open it, and CUDA would not start in the kernels.\n"
            "Fix: have the driver make its nodes mode 0666 (its default: NVreg_DeviceFileMode=0666), or pass "
            "--no-sandbox on a trusted throwaway machine."
        )
    return gpus
