"""The KV block map: the pool drawn as a grid of blocks, each coloured by the sequence that owns it.

A :class:`BlockSnapshot` is the pool at one moment (who owns each block, how many of its
slots hold tokens). Take one after every engine step with :func:`snapshot_blocks` and the
pictures show paging at work: blocks taken one at a time from anywhere in the pool, only
a sequence's last block partly empty, and every block coming back when a sequence ends.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from labkit.viz._axes import axes_or_new

FREE_COLOUR = "#eeeeee"
PALETTE = plt.get_cmap("tab20").colors


@dataclass(frozen=True)
class BlockSnapshot:
    """The pool at one moment: ``owners[b]`` owns block b (None if free), ``used_slots[b]`` tokens in it."""

    owners: tuple[str | None, ...]
    used_slots: tuple[int, ...]
    block_size: int
    label: str = ""

    @property
    def num_used(self) -> int:
        return sum(owner is not None for owner in self.owners)

    @property
    def empty_slots(self) -> int:
        """Slots inside owned blocks that hold no token (the paging waste: under one block per sequence)."""
        return sum(self.block_size - used for owner, used in zip(self.owners, self.used_slots) if owner is not None)


def snapshot_blocks(
    tables: Mapping[str, Sequence[int]],
    num_blocks: int,
    block_size: int = 16,
    lengths: Mapping[str, int] | None = None,
    label: str = "",
) -> BlockSnapshot:
    """The pool described by block tables (sequence id -> its blocks in order).

    ``lengths`` (sequence id -> tokens it holds) fills the blocks; without it every owned
    block counts as full. A block id outside the pool, a block owned twice, or a length
    that does not fit its table is an error, since the picture would hide a real bug.
    """
    owners: list[str | None] = [None] * num_blocks
    used = [0] * num_blocks
    for seq_id, table in tables.items():
        length = block_size * len(table) if lengths is None else lengths[seq_id]
        if length > block_size * len(table):
            raise ValueError(
                f"sequence {seq_id!r} holds {length} tokens but its table has only {len(table)} "
                f"blocks of {block_size}; allocate before writing"
            )
        for position, block in enumerate(table):
            if not (isinstance(block, int) and 0 <= block < num_blocks):
                raise ValueError(f"sequence {seq_id!r} lists block {block!r}, outside the pool 0..{num_blocks - 1}")
            if owners[block] is not None:
                raise ValueError(f"block {block} is owned by both {owners[block]!r} and {seq_id!r}")
            owners[block] = seq_id
            used[block] = max(0, min(block_size, length - position * block_size))
    return BlockSnapshot(tuple(owners), tuple(used), block_size, label)


def owner_colour(owner: str) -> tuple[float, float, float]:
    """A colour fixed by the owner's name, so a sequence keeps its colour from picture to picture."""
    return PALETTE[zlib.crc32(owner.encode()) % len(PALETTE)]


def plot_block_map(
    snapshot: BlockSnapshot, ax: Axes | None = None, columns: int = 16, show_ids: bool = True, title: str | None = None
) -> Axes:
    """The pool as a grid, ``columns`` blocks a row; the filled part of each block is solid, the empty part pale."""
    rows = -(-len(snapshot.owners) // columns)
    ax = axes_or_new(ax, (0.45 * columns, 0.45 * rows + 0.6))
    for block, (owner, used) in enumerate(zip(snapshot.owners, snapshot.used_slots)):
        x, y = block % columns, block // columns
        if owner is None:
            ax.add_patch(Rectangle((x, y), 0.92, 0.92, facecolor=FREE_COLOUR, edgecolor="white"))
            continue
        colour = owner_colour(owner)
        ax.add_patch(Rectangle((x, y), 0.92, 0.92, facecolor=colour, alpha=0.3, edgecolor="white"))
        ax.add_patch(Rectangle((x, y), 0.92 * used / snapshot.block_size, 0.92, facecolor=colour))
        if show_ids:
            ax.text(x + 0.46, y + 0.5, owner[-3:], ha="center", va="center", fontsize=6)
    ax.set_xlim(0, columns)
    ax.set_ylim(rows, 0)
    ax.set_aspect("equal")
    ax.set_axis_off()
    used_text = f"{snapshot.num_used}/{len(snapshot.owners)} blocks used, {snapshot.empty_slots} empty slots in them"
    ax.set_title(title or (f"{snapshot.label}: {used_text}" if snapshot.label else used_text), fontsize=9)
    return ax


def plot_block_maps(snapshots: Sequence[BlockSnapshot], columns: int = 16, per_row: int = 3) -> Figure:
    """Several moments side by side (for a printed page, where a slider cannot move)."""
    if not snapshots:
        raise ValueError("no snapshots to draw; take at least one with snapshot_blocks")
    grid_rows = -(-len(snapshots) // per_row)
    block_rows = -(-len(snapshots[0].owners) // columns)
    fig, axes = plt.subplots(
        grid_rows,
        per_row,
        squeeze=False,
        layout="constrained",
        figsize=(per_row * 0.3 * columns, grid_rows * (0.3 * block_rows + 0.7)),
    )
    for ax, snapshot in zip(axes.flat, snapshots):
        plot_block_map(snapshot, ax=ax, columns=columns)
    for ax in axes.flat[len(snapshots) :]:
        ax.set_axis_off()
    return fig


def block_map_slider(snapshots: Sequence[BlockSnapshot], columns: int = 16):
    """An ipywidgets slider that redraws the block map of the chosen snapshot (for a live notebook)."""
    import ipywidgets as widgets
    from IPython.display import display

    if not snapshots:
        raise ValueError("no snapshots to show; take at least one with snapshot_blocks")

    def draw(index: int) -> None:
        ax = plot_block_map(snapshots[index], columns=columns)
        display(ax.figure)
        plt.close(ax.figure)

    slider = widgets.IntSlider(value=0, min=0, max=len(snapshots) - 1, description="snapshot", continuous_update=False)
    return widgets.interactive(draw, index=slider)
