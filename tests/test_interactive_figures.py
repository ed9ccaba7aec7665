"""The interactive figures' JavaScript gives labkit's numbers, setting for setting.

Why: the book's sliders compute in the reader's browser, not in Python. If the page's formula
drifted from labkit.capacity, the cost model or the schedulers, the figure would teach other
numbers than the chapters and labs print. Here Chromium runs the page's own formulas
(labkit.viz.interactive.FORMULAS_JS) over a grid of settings and each answer must equal labkit's.
"""

from __future__ import annotations

import io
import itertools
import re

import numpy as np
import pytest
from browser_helpers import chromium_browser, new_tab  # noqa: F401  (the `browser` fixture)

from labkit.capacity import KV_BYTES, WEIGHT_BYTES, plan, sale_load, size_fleet, with_precision
from labkit.metrics import summarize
from labkit.sim.cost_model import CostModel, conversations_that_fit
from labkit.sim.simulator import simulate
from labkit.viz import interactive
from labkit.viz.interactive import FIGURE_GPUS, FIGURE_MODELS, FORMULAS_JS, PLAN_MODELS, REPLIES
from labkit.viz.plan_widget import FIXED, FLEET_WAYS, PLANNER_JS, capacity_plan_figure, planner_constants
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
    constants = interactive._constants() + planner_constants()
    return page.evaluate(f"(cases) => {{ {FORMULAS_JS}\n{constants}\n{body} }}", cases)


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


def test_a_chapter_table_rounds_as_the_figures_show(page) -> None:
    """labkit.viz.interactive.as_shown (the chapters' tables) prints what the page's fmt prints, halves included:
    every chip's critical batch for every model (the MI355X's is 312.5), and numbers chosen to sit on a half."""
    cases = [
        [CostModel.from_parts(g, m).critical_batch, 0] for g in FIGURE_GPUS.values() for m in FIGURE_MODELS.values()
    ]
    cases += [[x, d] for x in (0.5, 1.5, 2.5, 312.5, 1234.5, -2.5, 0.125, 1.005, 99.995) for d in (0, 1, 2)]
    page_says = run_js(page, "return cases.map(([x, d]) => fmt(x, d));", cases)
    assert page_says == [interactive.as_shown(x, d) for x, d in cases]


def blended(rgba: str, background: str) -> tuple[int, ...]:
    """What an "rgba(r, g, b, a)" fill looks like drawn over a "#rrggbb" background."""
    *colour, alpha = (float(part) for part in re.findall(r"[\d.]+", rgba))
    under = [int(background[i : i + 2], 16) for i in (1, 3, 5)]
    return tuple(round(alpha * c + (1 - alpha) * u) for c, u in zip(colour, under))


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_padding_is_drawn_in_the_pages_colour_scheme(browser, tmp_path, scheme) -> None:
    """The batching figure's padded seat-steps are a light grey on the light page and a dark grey on the dark one
    (a fixed light grey once glared out of the dark page): what the canvas shows, pixel by pixel."""
    from PIL import Image

    from labkit.viz.interactive import PADDING_FILL, SCHEMES, batching_figure, page_html

    page_file = tmp_path / "batching.html"
    page_file.write_text(f'<html data-theme="{scheme}"><body>{page_html(batching_figure())}</body></html>')
    tab = new_tab(browser, viewport={"width": 900, "height": 900})
    tab.goto(page_file.as_uri(), wait_until="load")
    tab.locator("[data-name]").first.wait_for()
    tab.wait_for_timeout(300)  # the canvas draws after the models change
    pixels = Image.open(io.BytesIO(tab.locator("canvas").first.screenshot())).convert("RGB")
    tab.close()
    padding = blended(PADDING_FILL, SCHEMES[scheme]["plot"])
    near = int((np.abs(np.asarray(pixels, dtype=int) - padding).max(axis=2) <= 3).sum())
    assert near > 500, f"{scheme}: no padding drawn in {padding} ({near} pixels)"
    luminance = sum(padding) / 3 / 255
    assert (luminance < 0.3) if scheme == "dark" else (luminance > 0.7), f"{scheme}: padding {padding}"


def test_the_batching_figure_numbers_whole_seats(browser, tmp_path) -> None:
    """Each seat is named once, by its number, in the middle of its row: no 2.5 seats, whatever the slider holds."""
    from labkit.viz.interactive import batching_figure, page_html

    page_file = tmp_path / "batching.html"
    page_file.write_text(f"<html><body>{page_html(batching_figure())}</body></html>")
    tab = new_tab(browser, viewport={"width": 900, "height": 900})
    tab.goto(page_file.as_uri(), wait_until="load")
    tab.locator("[data-name]").first.wait_for()
    seat_axes = "[...Bokeh.documents[0].all_models].filter(m => m.type === 'LinearAxis' && m.axis_label === 'seat')"
    labels = {}
    for seats in (5, 3, 10, 1):
        tab.evaluate("(seats) => { Bokeh.documents[0].get_model_by_name('seats').value = seats; }", seats)
        tab.wait_for_function(f"(seats) => {seat_axes}.every(axis => axis.ticker.ticks.length === seats)", arg=seats)
        labels[seats] = tab.evaluate(
            f"() => {seat_axes}.map(axis => [axis.ticker.ticks, axis.formatter.doFormat(axis.ticker.ticks, {{loc: 0}})])"
        )
    tab.close()
    for seats, axes in labels.items():
        whole = [str(seat) for seat in range(1, seats + 1)]
        middles = [seat + 0.5 for seat in range(seats)]
        assert axes == [[middles, whole]] * 2, f"{seats} seats: {axes}"


def test_a_count_of_one_is_singular(page) -> None:
    said = run_js(page, "return cases.map(n => counted(n, 'sequence'));", [1, 2, 1000])
    assert said == ["1 sequence", "2 sequences", "1,000 sequences"]


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
    makers = (interactive.kv_capacity_figure, interactive.step_time_figure, interactive.batching_figure)
    for make in (*makers, capacity_plan_figure):
        html = interactive.page_html(make())
        assert "<script" in html and not re.search(r"<script[^>]*\ssrc=", html), make.__name__
        assert "cdn.bokeh.org" not in html, make.__name__


def plan_cases() -> list[tuple]:
    """GPUs, models, storage, splits, lengths and promises: plans that fit, that do not, promises none keeps,
    prompts past a model's context."""
    return list(
        itertools.product(
            FIGURE_GPUS,
            PLAN_MODELS,
            ["bf16", "int8", "int4"],
            ["bf16", "fp8"],
            [1, 2, 8],
            [(1000, 300), (6144, 2048), (50, 20), (100_000, 1000)],  # the last: past two models' context
            [None, 50.0, 12.5],
        )
    )


def labkit_plan(gpu, model, weights, kv, ways, lengths, promise_ms):
    """What labkit's planner says for one case: the plan, or None where it refuses the settings."""
    spec = with_precision(PLAN_MODELS[model], weights=weights, kv=kv)
    promise_s = None if promise_ms is None else promise_ms / 1e3
    try:
        return plan(FIGURE_GPUS[gpu], spec, *lengths, promise_s=promise_s, tensor_parallel=ways, **FIXED)
    except ValueError:
        return None


# The plan's figures the page shows (CapacityPlan.to_dict names): each must be computed and equal labkit's.
SHOWN_FIGURES = {
    "conversations",
    "kv_budget_bytes",
    "kv_bytes_per_conversation",
    "decode_memory_s",
    "decode_compute_s",
    "decode_step_s",
    "prefill_s",
    "gpu_s_per_request",
    "request_ceiling_per_s",
    "tokens_per_s",
    "speedup_over_single_stream",
    "cost_per_million_tokens",
    "decode_share",
    "token_interval_s",
    "promise_load_per_s",
    "promise_in_flight",
    "tensor_parallel",
}


def test_the_capacity_plan_matches_labkits_planner(page) -> None:
    """Every figure the chapter 8 widget shows equals plan()'s, and it refuses exactly what plan() refuses."""
    grid = plan_cases()
    got = run_js(
        page,
        PLANNER_JS
        + """return cases.map(([gpu, model, w, kv, ways, [prompt, answer], promise]) => {
             const m = {...MODELS[model], bytes_per_param: WEIGHT_BYTES[w], kv_bytes_per_value: KV_BYTES[kv]};
             try {
               const p = planCapacity(GPUS[gpu], m, prompt, answer, FIXED.memory_fraction, FIXED.overhead_s,
                                      promise === null ? null : promise / 1e3, FIXED.price_per_gpu_hour, ways);
               delete p.stepAt;
               return p;
             } catch (error) { if (error instanceof PlanError) return error.message; throw error; }
           });""",
        grid,
    )
    refused = 0
    for case, page_says in zip(grid, got):
        expected = labkit_plan(*case)
        if expected is None:
            assert isinstance(page_says, str) and page_says.endswith("."), (case, page_says)
            refused += 1
            continue
        assert isinstance(page_says, dict), (case, page_says)
        figures = expected.to_dict()
        for name, value in page_says.items():
            if name in figures:
                assert value == figures[name], (case, name, value, figures[name])
        assert SHOWN_FIGURES <= set(page_says), (case, SHOWN_FIGURES - set(page_says))
    assert 0 < refused < len(grid) / 2  # the grid holds plans and refusals


def test_the_fleet_matches_labkits_size_fleet(page) -> None:
    """The fewest GPUs, and each split's replicas, for loads from a fraction of one card to a 10x sale."""
    grid = [
        (gpu, model, weights, promise, load)
        for gpu in ("sale-gpu", "h100-sxm", "friends-gpu", "mi355x")
        for model in ("llama-8b", "llama-70b")
        for weights in ("bf16", "int4")
        for promise in (None, 50.0)
        for load in (0.5, sale_load(10), 300.0)
    ]
    got = run_js(
        page,
        PLANNER_JS
        + """return cases.map(([gpu, model, w, promise, load]) => {
             const m = {...MODELS[model], bytes_per_param: WEIGHT_BYTES[w]};
             try {
               const fleet = sizeFleet(load, GPUS[gpu], m, 1000, 300, FIXED.memory_fraction, FIXED.overhead_s,
                                       promise === null ? null : promise / 1e3, FIXED.price_per_gpu_hour);
               return {best: [fleet.best.ways, fleet.best.replicas], replicas: fleet.options.map(o => o.replicas ?? null)};
             } catch (error) { if (error instanceof PlanError) return error.message; throw error; }
           });""",
        grid,
    )
    for (gpu, model, weights, promise, load), page_says in zip(grid, got):
        where = (gpu, model, weights, promise, load)
        try:
            sizing = size_fleet(
                load,
                FIGURE_GPUS[gpu],
                with_precision(PLAN_MODELS[model], weights=weights),
                1000,
                300,
                promise_s=None if promise is None else promise / 1e3,
                tensor_parallel=FLEET_WAYS,
                **FIXED,
            )
        except ValueError:
            assert isinstance(page_says, str), where
            continue
        assert page_says["best"] == [sizing.best.tensor_parallel, sizing.best.replicas], where
        assert page_says["replicas"] == [o.replicas for o in sizing.options], where
    assert any(isinstance(said, str) for said in got) and any(isinstance(said, dict) for said in got)
