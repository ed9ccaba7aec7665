"""Whether a kernel multiplies a value it loaded in int32: block numbers times a block's stride overflow past 2^31.

A paged kernel loads a block number from the table (int32) and multiplies it by the elements a block holds.
At Llama-3.1-8B's shapes a block holds 16 x 8 x 128 = 16,384 elements per pool, so from block 131,072 on
the product passes 2^31 and an int32 wraps to a negative offset: the kernel reads another block, or faults.
A test would need pools of 4 GiB to show it; Triton's IR shows it at once: follow the value loaded through
the table's pointer and see whether an ``arith.muli`` takes it while it is still ``i32``.
"""

from __future__ import annotations

import re

_OPERATION = re.compile(r"^\s*(%[\w.]+)(?::\d+)?\s*=\s*([\w.]+)\s+(.*)$")
_VALUE = re.compile(r"%[\w.]+")
_INT32 = re.compile(r"(?<![\w])i32\b|xi32>")


def int32_products(ttir: str, pointer: str) -> list[str]:
    """The lines of ``ttir`` (Triton's IR) that multiply, in int32, a value loaded through argument ``pointer``."""
    tainted = {f"%{pointer}"}
    found = []
    for line in ttir.splitlines():
        match = _OPERATION.match(line)
        if not match:
            continue
        result, operation, rest = match.groups()
        code, _, _ = rest.partition(" loc(")
        operands, _, types = code.rpartition(" : ")
        if not tainted.intersection(_VALUE.findall(operands)):
            continue
        if not _INT32.search(types.split("->")[-1]):  # converted (to int64, to a float): wraps no more
            continue
        if operation == "arith.muli":
            found.append(line.strip())
        tainted.add(result)
    return found
