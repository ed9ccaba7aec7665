"""The book's four interactive figures, played with in Chromium: each control moved, each new number checked.

Why: a figure whose formula is right (test_interactive_figures.py) can still be wired wrong: a
slider that redraws nothing, a select read under the wrong name, a number left from before. Here
a reader's moves (a drag, arrow keys, a pick from a list, a typed list of replies) go to the pages
this session built (`html`, shared with test_book.py), and every number the page then shows must
equal labkit's for the settings the page now holds. The page may ask for nothing beyond its files.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from browser_helpers import chromium_browser, new_tab, screenshot  # noqa: F401  (the `browser` fixture)
from PIL import Image
from test_book import built_book  # noqa: F401  (the `html` fixture: the book, built once per session)

from labkit.capacity import plan, size_fleet, with_precision
from labkit.metrics import summarize
from labkit.sim.cost_model import CostModel, conversations_that_fit
from labkit.sim.simulator import simulate
from labkit.viz.interactive import FIGURE_GPUS, FIGURE_MODELS, PLAN_MODELS, SCHEMES
from labkit.viz.plan_widget import FIXED, FLEET_WAYS
from labkit.workloads import replay_workload

pytestmark = pytest.mark.browser
LOCAL = ("file:", "data:", "blob:", "about:")


class Figure:
    """One chapter's page in a fresh tab, with what a test needs to play with its figure and read it."""

    def __init__(self, browser, page: Path) -> None:
        self.tab = new_tab(browser, viewport={"width": 1280, "height": 1000})
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.tab.on(
            "request", lambda request: None if request.url.startswith(LOCAL) else self.requests.append(request.url)
        )
        self.tab.on("console", lambda message: self.errors.append(message.text) if message.type == "error" else None)
        self.tab.on("pageerror", lambda error: self.errors.append(f"uncaught {error}"))
        self.tab.goto(page.as_uri(), wait_until="load")
        self.tab.locator("[data-name]").first.wait_for()  # the figure has drawn its first picture

    def values(self, *widgets: str) -> list:
        """What the named controls hold now, as the figure's own document says (one call to the page for all)."""
        return self.tab.evaluate(
            "names => names.map(name => Bokeh.documents[0].get_model_by_name(name).value)", widgets
        )

    def number(self, name: str) -> float:
        """The exact number behind a figure's shown value (its data-value)."""
        return float(self.tab.locator(f'[data-name="{name}"]').get_attribute("data-value"))

    def drag(self, slider: int, dx: float) -> None:
        """Drag the slider-th slider's handle ``dx`` pixels, as a mouse does."""
        handle = self.tab.locator(".noUi-handle").nth(slider)
        handle.scroll_into_view_if_needed()
        box = handle.bounding_box()
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        self.tab.mouse.move(x, y)
        self.tab.mouse.down()
        self.tab.mouse.move(x + dx, y, steps=8)
        self.tab.mouse.up()

    def press(self, slider: int, key: str, times: int = 1) -> None:
        handle = self.tab.locator(".noUi-handle").nth(slider)
        handle.focus()
        for _ in range(times):
            handle.press(key)

    def pick(self, select: int, label: str) -> None:
        self.tab.locator("select").nth(select).select_option(label=label)

    def close(self, shot: str) -> None:
        screenshot(self.tab, shot)
        self.tab.close()
        assert not self.errors, f"console errors: {self.errors}"
        assert not self.requests, f"the page asked the network for {self.requests}"


def test_kv_capacity_sliders_give_labkits_conversations(html: Path, browser) -> None:
    figure = Figure(browser, html / "book" / "kv_memory.html")

    def labkit_says() -> int:
        name, weights, kv, fraction, gpu, tokens = figure.values("model", "weights", "kv", "fraction", "gpu", "tokens")
        model = with_precision(FIGURE_MODELS[name], weights, kv)
        share = round(fraction, 2)  # the page rounds the slider to a whole percent
        try:
            return conversations_that_fit(FIGURE_GPUS[gpu].memory_bytes, share, model, tokens)
        except ValueError:  # the weights alone fill that memory: the page says none fit
            return 0

    assert figure.number("conversations") == labkit_says() == 4  # the chapter's 24 GB card, 8K chats
    moves = [
        lambda: figure.drag(0, -40),  # shorter conversations
        lambda: figure.press(1, "ArrowRight", 5),  # a larger share of memory
        lambda: figure.pick(3, "fp8: 1 byte"),  # bytes per cached number
        lambda: figure.pick(2, "int4: 0.52 bytes"),  # bytes per weight
        lambda: figure.pick(1, "NVIDIA H100 SXM"),
        lambda: figure.pick(0, "Qwen3 8B"),
    ]
    for move in moves:
        before = figure.number("conversations")
        move()
        assert figure.number("conversations") == labkit_says() != before
    figure.close("book-browser-interactive-kv-capacity")


def test_step_time_sliders_give_the_cost_models_terms(html: Path, browser) -> None:
    figure = Figure(browser, html / "book" / "two_numbers.html")

    def check() -> tuple[float, float]:
        gpu, model, batch, context = figure.values("gpu", "model", "batch", "context")
        cost = CostModel.from_parts(FIGURE_GPUS[gpu], FIGURE_MODELS[model])
        step = cost.pass_breakdown(batch, batch * context)
        assert (figure.number("memory"), figure.number("compute")) == (step.memory_s * 1e3, step.compute_s * 1e3)
        assert figure.number("critical") == cost.critical_batch
        assert figure.number("crossover") == cost.decode_crossover_batch(context)
        return figure.number("memory"), figure.number("crossover")

    check()
    assert figure.number("critical") == 75  # the worked example's A100-class card
    moves = [
        lambda: figure.drag(1, 120),  # more sequences in the pass
        lambda: figure.press(0, "ArrowLeft", 4),  # less context per sequence
        lambda: figure.pick(1, "NVIDIA H100 SXM"),
        lambda: figure.pick(0, "Qwen3 8B"),
    ]
    for move in moves:
        before = check()
        move()
        assert check() != before
    figure.close("book-browser-interactive-step-time")


def test_batching_slider_and_replies_give_the_schedulers_counts(html: Path, browser) -> None:
    figure = Figure(browser, html / "book" / "batching.html")
    cost = CostModel.from_parts(FIGURE_GPUS["a100-80gb"], FIGURE_MODELS["llama-8b"], overhead_s=0.003)

    def check() -> list[float]:
        replies, seats = figure.values("replies", "seats")
        lengths = [int(n) for n in replies.replace(",", " ").split()]
        requests = replay_workload([0.0] * len(lengths), [8] * len(lengths), lengths)
        shown = []
        for policy in ("static", "continuous"):
            run = summarize(simulate(requests, cost, policy, num_blocks=1000, max_num_seqs=seats))
            shown += [figure.number(f"{policy}-steps"), figure.number(f"{policy}-padded")]
            assert shown[-2:] == [run.num_steps, run.padded_slot_steps], policy
        return shown

    assert check() == [84, 218, 58, 0]  # the chapter's ten replies in five seats
    moves = [
        lambda: figure.press(0, "ArrowLeft", 2),  # three seats
        lambda: figure.drag(0, 200),  # many seats
        lambda: (
            figure.tab.locator("input.bk-input[type=text]").fill("50, 1, 1, 1, 40, 7"),
            figure.tab.keyboard.press("Enter"),
        ),
    ]
    for move in moves:
        before = check()
        move()
        assert check() != before
    figure.close("book-browser-interactive-batching")


# Every control of a figure, found through the widgets' shadow roots: its text and background colours, its edges.
CONTROLS_JS = """() => {
  const found = [];
  const visit = (root) => {
    for (const element of root.querySelectorAll('*')) {
      if (element.matches('input.bk-input, select.bk-input')) {
        const style = getComputedStyle(element), box = element.getBoundingClientRect();
        found.push({color: style.color, background: style.backgroundColor, left: box.left, right: box.right});
      }
      if (element.shadowRoot) visit(element.shadowRoot);
    }
  };
  visit(document);
  return {controls: found, width: document.documentElement.clientWidth};
}"""


def luminance(css: str) -> float:
    """WCAG relative luminance of an ``rgb(...)``/``rgba(...)`` colour."""
    red, green, blue = (int(part) / 255 for part in css[css.index("(") + 1 : css.index(")")].split(",")[:3])
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in (red, green, blue)]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def controls_problems(tab, chapter: str, scheme: str) -> list[str]:
    """Every control of the page unreadable in ``scheme`` (contrast under 4.5) or pushed off a phone's screen."""
    seen = tab.evaluate(CONTROLS_JS)
    if not seen["controls"]:
        return [f"{chapter}: no controls found"]
    problems = []
    for control in seen["controls"]:
        if contrast(luminance(control["color"]), luminance(control["background"])) < 4.5:
            problems.append(f"{chapter} ({scheme}): text {control['color']} on {control['background']}")
        if not (control["left"] >= 0 and control["right"] <= seen["width"]):
            problems.append(f"{chapter} ({scheme}): {control} off-screen")
    return problems


def test_a_list_of_replies_too_long_or_not_whole_numbers_is_refused_and_the_charts_cleared(html: Path, browser) -> None:
    figure = Figure(browser, html / "book" / "batching.html")
    field = figure.tab.locator("input.bk-input[type=text]")
    for typed, said in (
        (", ".join(["5"] * 300), "at most 40 reply lengths"),
        ("1e2, 3", "digits only"),
        ("0x10, 3", "digits only"),
    ):
        field.fill(typed)
        figure.tab.keyboard.press("Enter")
        figure.tab.wait_for_function(
            "said => Bokeh.documents[0].get_model_by_name('answer').text.includes(said)", arg=said
        )
        bars = figure.tab.evaluate(
            "() => [...Bokeh.documents[0].all_models].filter(m => m.data && 'left' in m.data).map(m => m.data.left.length)"
        )
        assert bars and all(count == 0 for count in bars), f"{typed[:20]}...: the charts still show {bars} bars"
    figure.close("book-browser-interactive-batching-refused")


class CapacityPlan(Figure):
    """Chapter 8's plan: its selects by name, its typed fields, and every figure it shows beside labkit's."""

    SELECTS = ("gpu", "model", "weights", "kv", "tp")  # in the page's order
    FIELDS = ("prompt", "answer", "promise", "load")
    SETTINGS = SELECTS + FIELDS

    def choose(self, select: str, value: str) -> None:
        """Pick the option whose key (the preset's name in labkit) is ``value``, by the label a reader sees."""
        options = self.tab.evaluate(f"() => Bokeh.documents[0].get_model_by_name({select!r}).options")
        label = next(
            option[1] if isinstance(option, list) else option
            for option in options
            if option[0] == value or option == value
        )
        self.tab.locator("select").nth(self.SELECTS.index(select)).select_option(label=label)

    def type(self, field: str, text: str) -> None:
        box = self.tab.locator("input.bk-input[type=text]").nth(self.FIELDS.index(field))
        box.fill(text)
        box.press("Enter")

    def shown(self) -> dict[str, str]:
        """Every figure the plan shows: name -> exact value (data-value)."""
        return dict(
            self.tab.locator("[data-name]").evaluate_all("els => els.map(e => [e.dataset.name, e.dataset.value])")
        )

    def problem(self) -> str:
        return self.tab.evaluate("() => Bokeh.documents[0].get_model_by_name('plan').text")

    def curve_points(self) -> int:
        return self.tab.evaluate(
            "() => [...Bokeh.documents[0].all_models].filter(m => m.data && 'x' in m.data).map(m => m.data.x.length)"
            ".reduce((a, b) => a + b, 0)"
        )

    def labkit_says(self) -> dict[str, float | str]:
        """What labkit's planner (and size_fleet, given a load) says for the settings the page holds now."""
        value = dict(zip(self.SETTINGS, self.values(*self.SETTINGS))).__getitem__
        model = with_precision(PLAN_MODELS[value("model")], value("weights"), value("kv"))
        promise, load = value("promise").strip(), value("load").strip()
        settings = dict(
            hardware=FIGURE_GPUS[value("gpu")],
            model=model,
            prompt_len=int(value("prompt")),
            answer_len=int(value("answer")),
            promise_s=float(promise) / 1e3 if promise else None,
            **FIXED,
        )
        figures = plan(**settings, tensor_parallel=int(value("tp"))).to_dict()
        if load:
            sizing = size_fleet(float(load), tensor_parallel=FLEET_WAYS, **settings)
            for option in sizing.options:
                if option.gpus is None:
                    figures[f"fleet-{option.tensor_parallel}-gpus"] = "none"
                else:
                    figures[f"fleet-{option.tensor_parallel}-gpus"] = option.gpus
                    figures[f"fleet-{option.tensor_parallel}-replicas"] = option.replicas
            figures["fleet-best-gpus"], figures["fleet-best-ways"] = sizing.best.gpus, sizing.best.tensor_parallel
        return figures

    def check(self) -> dict[str, str]:
        """Every figure on the page equals labkit's; the page shows the plan's main figures."""
        shown, figures = self.shown(), self.labkit_says()
        for name, text in shown.items():
            expected = figures[name]
            assert (text if expected == "none" else float(text)) == expected, (name, text, expected)
        assert {"conversations", "decode_step_s", "request_ceiling_per_s", "token_interval_s"} <= set(shown)
        assert self.curve_points() > 0
        return shown


def test_the_capacity_plan_gives_labkits_plan_for_every_setting(html: Path, browser) -> None:
    figure = CapacityPlan(browser, html / "book" / "capacity_planning.html")
    first = figure.check()
    # the chapter's worked example, attention's 1.7 ms of prefill counted (the lesson's 6.9 and 88 without it)
    assert round(float(first["request_ceiling_per_s"]), 1) == 6.8 and float(first["conversations"]) == 328
    assert round(float(first["promise_in_flight"])) == 87
    moves = [
        lambda: figure.type("prompt", "2000"),
        lambda: figure.type("answer", "1200"),
        lambda: figure.type("promise", "35.5"),
        lambda: figure.choose("kv", "fp8"),
        lambda: figure.choose("weights", "int8"),
        lambda: figure.choose("gpu", "h100-sxm"),
        lambda: figure.type("load", "59"),  # a fleet for the 10x sale
        lambda: figure.choose("tp", "2"),
        lambda: figure.choose("model", "llama-70b"),  # 70B at 1 byte per weight, split two ways
        lambda: figure.choose("weights", "int4"),
        lambda: figure.choose("tp", "8"),
        lambda: figure.choose("gpu", "b200"),
        lambda: figure.type("promise", ""),  # no promise: the ceiling carries the load
        lambda: figure.type("load", "0.5"),
        lambda: figure.choose("model", "qwen3-8b"),
        lambda: figure.choose("gpu", "rtx-4090"),
        lambda: figure.choose("tp", "1"),
        lambda: figure.type("answer", "40"),
        lambda: figure.choose("model", "smollm2-135m"),
        lambda: figure.type("promise", "20"),
    ]
    for move in moves:
        before = figure.shown()
        move()
        assert figure.check() != before
    figure.close("book-browser-interactive-capacity-plan")


def test_the_capacity_plan_refuses_bad_input_and_clears_what_it_showed(html: Path, browser) -> None:
    figure = CapacityPlan(browser, html / "book" / "capacity_planning.html")
    for field, typed, said in (
        ("prompt", "1e3", "prompt tokens: type a whole number from 1 to 200,000"),
        ("prompt", "0x10", "digits only"),
        ("answer", "-5", "answer tokens: type a whole number"),
        ("answer", "300000", "answer tokens"),
        ("promise", "0", "promise (ms): type a number from 1 to 10,000"),
        ("load", "lots", "load (requests/s): type a number from 0.01"),
    ):
        figure.type(field, typed)
        figure.tab.wait_for_function(
            "said => Bokeh.documents[0].get_model_by_name('plan').text.includes(said)", arg=said
        )
        assert figure.shown() == {} and figure.curve_points() == 0, f"{field}={typed}: stale figures left"
        figure.type(field, {"prompt": "1000", "answer": "300", "promise": "50", "load": ""}[field])
        figure.check()
    for move, said in (
        (lambda: figure.choose("model", "llama-70b"), "split the model over 2 GPUs"),  # 141 GB on one 80 GB card
        (lambda: figure.choose("tp", "2"), None),  # the fix it names works
        (lambda: figure.type("promise", "5"), "No load keeps a token every 5.0 ms"),
    ):
        move()
        if said is None:
            figure.check()
            continue
        figure.tab.wait_for_function(
            "said => Bokeh.documents[0].get_model_by_name('plan').text.includes(said)", arg=said
        )
        assert figure.shown() == {} and figure.curve_points() == 0, said
    figure.close("book-browser-interactive-capacity-refused")


def hex_luminance(colour: str) -> float:
    return luminance("rgb(" + ",".join(str(int(colour[i : i + 2], 16)) for i in (1, 3, 5)) + ")")


def contrast(first: float, second: float) -> float:
    light, dark = sorted((first, second), reverse=True)
    return (light + 0.05) / (dark + 0.05)


# Each plot's background and the colours of its words (axis labels, tick labels, title, legend), as drawn now.
PLOT_COLOURS_JS = """() => [...Bokeh.documents[0].all_models].filter(m => Array.isArray(m.left) && Array.isArray(m.renderers))
  .map(plot => ({background: plot.background_fill_color, words: [...plot.left, ...plot.below, ...plot.center,
    ...(plot.title && plot.title.text ? [plot.title] : [])].flatMap(part => [part.major_label_text_color,
    part.axis_label_text_color, part.label_text_color, part.text_color]).filter(c => typeof c === 'string')}))"""


@pytest.mark.parametrize("chapter", ["kv_memory", "two_numbers", "batching", "capacity_planning"])
def test_controls_and_plots_follow_the_readers_colour_scheme_on_a_phone(html: Path, browser, chapter) -> None:
    """Each control reads (contrast 4.5 or more) and fits a 390 px phone, in the reader's dark and light settings; in
    dark mode a plot is dark and its words light; switching the theme repaints it, and back. One tab per chapter:
    the reader's setting changes while the page is open, as the theme follows it (pydata-sphinx-theme's auto mode)."""
    tab = new_tab(browser, viewport={"width": 390, "height": 844}, color_scheme="dark")
    tab.goto((html / "book" / f"{chapter}.html").as_uri(), wait_until="load")
    tab.locator("[data-name]").first.wait_for()
    for scheme in ("dark", "light"):
        tab.emulate_media(color_scheme=scheme)
        tab.wait_for_function("scheme => document.documentElement.dataset.theme === scheme", arg=scheme)
        problems = controls_problems(tab, chapter, scheme)
        assert not problems, "\n".join(problems)
        screenshot(tab, f"book-browser-phone-{scheme}-{chapter}")
    for scheme in ("dark", "light", "dark"):
        tab.evaluate("scheme => { document.documentElement.dataset.theme = scheme; }", scheme)
        tab.wait_for_function(
            "colour => [...Bokeh.documents[0].all_models].some(m => m.background_fill_color === colour)",
            arg=SCHEMES[scheme]["plot"],
        )
        plots = tab.evaluate(PLOT_COLOURS_JS)
        assert plots, f"{chapter}: no plots found"
        for plot in plots:
            background = hex_luminance(plot["background"])
            assert (background < 0.1) if scheme == "dark" else (background > 0.9), f"{chapter} ({scheme}): {plot}"
            assert plot["words"], f"{chapter}: a plot without axis labels"
            for colour in plot["words"]:
                assert contrast(hex_luminance(colour), background) >= 4.5, f"{chapter} ({scheme}): {colour} on {plot}"
    canvas = tab.locator("canvas").first  # what is drawn, not only what the models say: the plot's edge is dark
    canvas.scroll_into_view_if_needed()
    pixels = Image.open(io.BytesIO(canvas.screenshot())).convert("L")
    corner = pixels.getpixel((3, 3))
    assert corner < 60, f"{chapter}: the plot is drawn light in dark mode (grey level {corner} of 255)"
    screenshot(tab, f"book-browser-dark-plots-{chapter}")
    tab.close()
