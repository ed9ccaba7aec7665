"""Figures shown as SVG whose words stay text: sharp at any width, legible when the book's column shrinks them.

Why: a PNG drawn at 100 dpi and shrunk to a 688-pixel column turns 7-point labels into 6-pixel smudges.
An SVG keeps every line exact at any size, and with its text kept as text (not outlines) a reader can
select and search the labels, and a test can read the size each one is shown at.
"""

from __future__ import annotations

import matplotlib as mpl


def use_svg_figures() -> None:
    """Show every figure drawn after this call as SVG with its text as text (in IPython; elsewhere, SVG files)."""
    mpl.rcParams["svg.fonttype"] = "none"  # words as <text>, in the reader's sans-serif font
    mpl.rcParams["svg.hashsalt"] = "labkit"  # the same ids on every build: an unchanged figure stays byte-identical
    from IPython import get_ipython

    if get_ipython() is not None:  # a kernel (the book's build, a notebook): its inline figures become SVG
        from matplotlib_inline.backend_inline import set_matplotlib_formats

        set_matplotlib_formats("svg", metadata={"Date": None})  # no build date inside: same figure, same file
