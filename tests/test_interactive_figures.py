"""The interactive figures' JavaScript gives labkit's numbers, setting for setting.

Why: the book's sliders compute in the reader's browser, not in Python. If the page's formula
drifted from labkit.capacity, the cost model or the schedulers, the figure would teach other
numbers than the chapters and labs print. Here Chromium runs the page's own formulas
(labkit.viz.interactive.FORMULAS_JS) over a grid of settings and each answer must equal labkit's.
"""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from browser_helpers import chromium_browser, new_tab  # noqa: F401  (the `browser` fixture)

from labkit.capacity import KV_BYTES, WEIGHT_BYTES, with_precision
from labkit.metrics import summarize
from labkit.sim.cost_model import CostModel, conversations_that_fit
from labkit.sim.simulator import simulate
from labkit.viz import interactive
from labkit.viz.interactive import FIGURE_GPUS, FIGURE_MODELS, FORMULAS_JS, REPLIES
from labkit.workloads import replay_workload

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(browser):
    """A blank tab: the formulas need no book around them."""
    tab = new_tab(browser)
    yield tab
    tab.close()


def run_js(page, body: str, cases: list) -> list:
    """``body`` (which sees ``cases``) evaluated in Chromium with the figures' formulas and presets in scope."""
    return page.evaluate(f"(cases) => {{ {FORMULAS_JS}\n{interactive._constants()}\n{body} }}", cases)


def test_conversations_that_fit_match_labkit(page) -> None:
    grid = list(
        itertools.product(
            FIGURE_MODELS, FIGURE_GPUS, [256, 1000, 1300, 8192, 32768], [0.5, 0.85, 0.9, 1.0], WEIGHT_BYTES, KV_BYTES
        )
    )
    got = run_js(
        page,
        """return cases.map(([model, gpu, tokens, share, w, kv]) => conversationsThatFit(GPUS[gpu].memory_bytes, share,
             {...MODELS[model], bytes_per_param: WEIGHT_BYTES[w], kv_bytes_per_value: KV_BYTES[kv]}, tokens));""",
        grid,
    )
    for (model, gpu, tokens, share, weights, kv), page_says in zip(grid, got):
        spec = with_precision(FIGURE_MODELS[model], weights=weights, kv=kv)
        try:
            expected = conversations_that_fit(FIGURE_GPUS[gpu].memory_bytes, share, spec, tokens)
        except ValueError:  # labkit refuses a card the weights alone fill; the page says none fit
            expected = 0
        assert page_says == expected, (model, gpu, tokens, share, weights, kv)
    assert len(grid) > 1000 and any(got) and not all(got)  # the grid holds both answers


def test_decode_terms_and_critical_batch_match_the_cost_model(page) -> None:
    grid = list(itertools.product(FIGURE_MODELS, FIGURE_GPUS, [0, 1150, 4096, 8192], [1, 64, 75, 300, 512]))
    got = run_js(
        page,
        """return cases.map(([model, gpu, context, batch]) => {
             const m = MODELS[model], g = GPUS[gpu];
             return [decodeTerms(g, m, batch, context), criticalBatch(g, m), decodeCrossover(g, m, context)];
           });""",
        grid,
    )
    for (model, gpu, context, batch), (terms, critical, crossover) in zip(grid, got):
        cost = CostModel.from_parts(FIGURE_GPUS[gpu], FIGURE_MODELS[model])
        step = cost.pass_breakdown(batch, batch * context)
        where = (model, gpu, context, batch)
        assert (terms["memory"], terms["compute"]) == (step.memory_s, step.compute_s), where
        assert critical == cost.critical_batch, where
        assert crossover == cost.decode_crossover_batch(context), where
    assert any(c == float("inf") for *_, c in got) and any(c < 1e6 for *_, c in got)


def replies_to_try() -> list[list[int]]:
    rng = np.random.default_rng(26)
    return [REPLIES, [1], [3, 3, 3], *(rng.integers(1, 60, size=n).tolist() for n in (4, 9, 13, 20))]


def test_static_and_continuous_steps_match_labkits_schedulers(page) -> None:
    """The figure's step and padding counts against the simulator driving the engine's own schedulers."""
    grid = [(lengths, seats) for lengths in replies_to_try() for seats in range(1, 11)]
    got = run_js(
        page,
        """return cases.map(([lengths, seats]) => [staticBatching(lengths, seats), continuousBatching(lengths, seats)]
             .map(run => [run.steps, run.padded]));""",
        grid,
    )
    cost = CostModel.from_parts(FIGURE_GPUS["a100-80gb"], FIGURE_MODELS["llama-8b"], overhead_s=0.003)
    for (lengths, seats), page_says in zip(grid, got):
        requests = replay_workload([0.0] * len(lengths), [8] * len(lengths), lengths)
        for policy, (steps, padded) in zip(("static", "continuous"), page_says):
            run = summarize(simulate(requests, cost, policy, num_blocks=1000, max_num_seqs=seats))
            assert (steps, padded) == (run.num_steps, run.padded_slot_steps), (policy, lengths, seats)
    assert got[4] == [[84, 218], [58, 0]]  # the chapter's ten replies in five seats


def test_the_figures_load_nothing_from_the_network() -> None:
    """Every figure's HTML carries BokehJS inline: no <script src>, no CDN address."""
    for make in (interactive.kv_capacity_figure, interactive.step_time_figure, interactive.batching_figure):
        html = interactive.page_html(make())
        assert "<script" in html and not re.search(r"<script[^>]*\ssrc=", html), make.__name__
        assert "cdn.bokeh.org" not in html, make.__name__
