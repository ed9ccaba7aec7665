"""The one way the grader reads a file that learner code could have written: bounded, non-blocking, no links.

A kernel can put anything where the grader expects a file: a symlink to a host file, a FIFO with
no writer (an open() that blocks for ever), a device, a sparse file of terabytes. So every such
read opens the name inside its folder without following links and without blocking, checks on
the open descriptor that it is a regular file, and refuses it unread when it is larger than the
caller's limit; it never reads more than the limit.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class UntrustedFileRefused(Exception):
    """The file is not a regular file of at most the limit's size (the message says which)."""


def read_untrusted(folder: Path, name: str, limit: int, bound: str = "allowed") -> bytes | None:
    """The bytes of `folder/name`, or None if there is no such file; UntrustedFileRefused if it is not a
    regular file (a symlink, a FIFO, a device) or is larger than `limit` bytes (`bound` says why that many)."""
    if "/" in name or name in ("", ".", ".."):
        raise UntrustedFileRefused(f"{name!r} is not a plain file name")
    folder_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder_fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise UntrustedFileRefused(f"it could not be opened as a plain file ({error.strerror})") from None
    finally:
        os.close(folder_fd)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UntrustedFileRefused("it is not a regular file")
        if info.st_size > limit:
            raise UntrustedFileRefused(f"it is {info.st_size:,} bytes, more than the {limit:,} bytes {bound}")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise UntrustedFileRefused(f"it grew past the {limit:,} bytes {bound}")
    return data
