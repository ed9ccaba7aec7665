"""Three figures a reader can play with in the static HTML book, with no kernel and no network.

Why: the lessons say "move the sliders", but a built page has no Python behind it. So each
figure carries its arithmetic as a few lines of JavaScript (``FORMULAS_JS``) that repeat, step
for step, what labkit's Python computes: ``conversations_that_fit``, ``CostModel.pass_breakdown``
and ``critical_batch``, and the static and continuous schedulers' step counts. The tests
(tests/test_interactive_figures.py) run those lines in Chromium against labkit for a grid of
settings. Bokeh draws the figures from its library inlined in the page (``page_html``).

In a chapter: ``HTML(page_html(kv_capacity_figure()))`` in a hidden code cell.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from bokeh.document import Document
from bokeh.embed import components
from bokeh.events import DocumentReady
from bokeh.layouts import column, row
from bokeh.models import (
    ColumnDataSource,
    CustomJS,
    CustomJSTickFormatter,
    Div,
    FixedTicker,
    InlineStyleSheet,
    Plot,
    Range1d,
    Select,
    Slider,
    Span,
    TextInput,
)
from bokeh.palettes import Category10_10
from bokeh.plotting import figure
from bokeh.resources import INLINE

from labkit.capacity import FRIENDS_GPU, KV_BYTES, LESSON_LLAMA_8B, LLAMA_3_1_70B, SALE_GPU, WEIGHT_BYTES
from labkit.capacity.parallel import hidden_size_of
from labkit.sim.cost_model import MODELS
from labkit.sim.hardware import PRESETS

# Only the parts of BokehJS these figures use (plots and widgets), inlined: 1.6 MB instead of 3.9.
RESOURCES = INLINE.clone(components=["bokeh", "bokeh-widgets"])

# What the page computes. Each function mirrors the labkit code named above it, same operations
# in the same order, so a browser's doubles come out equal to Python's.
FORMULAS_JS = """
// labkit.sim.cost_model.ModelSpec.kv_bytes_per_token: a key and a value per layer per KV head
function kvBytesPerToken(m) { return 2 * m.layers * m.kv_heads * m.head_dim * m.kv_bytes_per_value; }

// labkit.sim.cost_model.conversations_that_fit (0 where the weights alone fill the memory)
function conversationsThatFit(gpuBytes, fraction, m, tokens) {
  const left = gpuBytes * fraction - m.parameters * m.bytes_per_param;
  return left <= 0 ? 0 : Math.floor(left / (tokens * kvBytesPerToken(m)));
}

// labkit's CostModel.pass_breakdown(batch, batch * context): a decode pass, no overhead
function decodeTerms(gpu, m, batch, context) {
  return {
    memory: (m.parameters * m.bytes_per_param + kvBytesPerToken(m) * (batch * context)) / gpu.bandwidth,
    compute: 2 * m.parameters * batch / gpu.flops,
  };
}

// CostModel.critical_batch: tokens per pass whose arithmetic takes as long as reading the weights
function criticalBatch(gpu, m) { return gpu.flops / gpu.bandwidth * (m.parameters * m.bytes_per_param) / (2 * m.parameters); }

// CostModel.decode_crossover_batch: the batch at which decode with this context turns arithmetic-bound
function decodeCrossover(gpu, m, context) {
  const gap = 2 * m.parameters / gpu.flops - context * kvBytesPerToken(m) / gpu.bandwidth;
  return gap <= 0 ? Infinity : m.parameters * m.bytes_per_param / gpu.bandwidth / gap;
}

// labkit's "static" policy: groups of `seats` run until their longest reply ends
function staticBatching(lengths, seats) {
  const spans = [];
  let start = 0, padded = 0;
  for (let first = 0; first < lengths.length; first += seats) {
    const group = lengths.slice(first, first + seats), longest = Math.max(...group);
    group.forEach((length, seat) => {
      spans.push({seat, start, length, request: first + seat, padding: longest - length});
      padded += longest - length;
    });
    start += longest;
  }
  return {spans, steps: start, padded};
}

// labkit's "continuous" policy: each request takes the seat that frees up first, nothing is padded
function continuousBatching(lengths, seats) {
  const freeAt = new Array(seats).fill(0), spans = [];
  lengths.forEach((length, request) => {
    const seat = freeAt.indexOf(Math.min(...freeAt));
    spans.push({seat, start: freeAt[seat], length, request, padding: 0});
    freeAt[seat] += length;
  });
  return {spans, steps: Math.max(...freeAt), padded: 0};
}

// A number a test can read exactly (data-value) beside its rounded text
function shown(value, text, name) { return `<b data-name="${name}" data-value="${value}">${text}</b>`; }
function fmt(x, digits = 0) { return x.toLocaleString('en-US', {maximumFractionDigits: digits, minimumFractionDigits: digits}); }
// "1 sequence", "2 sequences": a count with its noun
function counted(n, noun) { return `${fmt(n)} ${n === 1 ? noun : noun + 's'}`; }
"""


def as_shown(value: float, digits: int = 0) -> str:
    """A number as the figures' ``fmt`` shows it, so a chapter's table and its figure print the same digits.

    The browser rounds the number's shortest decimal form (``repr``: 1.005, not the double just below it) and
    sends a half away from zero, thousands with commas; Python's own rounding would print 312.5 as 312, the page 313.
    """
    step = Decimal(1).scaleb(-digits)
    return f"{Decimal(repr(float(value))).quantize(step, rounding=ROUND_HALF_UP):,}"


ANSWER_STYLE = {"font-size": "15px"}  # the figure's result line, as large as the chapter's prose
# A figure follows the book's colour scheme (pydata-sphinx-theme sets data-theme="light" or "dark" on <html>).
# Its controls live in Bokeh's shadow roots, which no page rule reaches; custom properties do inherit into
# them, so the page's <style> (WIDGET_CSS) sets the colours and each control's stylesheet reads them.
THEMED_CONTROL_CSS = (
    ".bk-input, select.bk-input { color: var(--labkit-ink, #1f2328); background-color: var(--labkit-field, #fff); "
    "border-color: var(--labkit-edge, #c9ccd1); } "
    "label, .bk-slider-title, .bk-input-group { color: var(--labkit-ink, #1f2328); }"
)
# Rows of controls wrap onto the next line on a narrow screen (a phone) instead of running off its side.
WRAPPING_ROW_CSS = ":host { flex-wrap: wrap; column-gap: 12px; }"
# The colours of each scheme, for the controls (CSS) and the plots (set by PAINT_JS on the Bokeh models).
SCHEMES = {
    "light": dict(
        ink="#1f2328",
        field="#ffffff",
        edge="#c9ccd1",
        problem="#b3261e",
        plot="#ffffff",
        axis="#57606a",
        grid="#e5e7ea",
    ),
    "dark": dict(
        ink="#e6e8eb",
        field="#1e2228",
        edge="#5b6470",
        problem="#ff8a80",
        plot="#1b1f24",
        axis="#9aa4b0",
        grid="#363d46",
    ),
}
# In dark mode the theme paints every HTML output on a light card; a figure that follows the scheme needs none.
WIDGET_CSS = (
    ".labkit-widget {{ --labkit-ink: {light[ink]}; --labkit-field: {light[field]}; --labkit-edge: {light[edge]}; "
    "--labkit-problem: {light[problem]}; color: var(--labkit-ink); }} "
    "html[data-theme=dark] .labkit-widget {{ --labkit-ink: {dark[ink]}; --labkit-field: {dark[field]}; "
    "--labkit-edge: {dark[edge]}; --labkit-problem: {dark[problem]}; }} "
    "html[data-theme=dark] .bd-content div.cell_output div.text_html:has(> div.labkit-widget) "
    "{{ background-color: transparent; }}"
).format(**SCHEMES)
# Paint every plot of the figure in the page's scheme now, and again whenever the reader switches it.
PAINT_JS = """
const paint = () => {
  const c = SCHEMES[document.documentElement.dataset.theme === 'dark' ? 'dark' : 'light'];
  for (const plot of plots) {
    plot.setv({background_fill_color: c.plot, border_fill_color: c.plot, outline_line_color: c.grid});
    if (plot.title) plot.title.text_color = c.ink;
    for (const part of [...plot.left, ...plot.right, ...plot.above, ...plot.below, ...plot.center]) {
      if ('axis_line_color' in part) {
        part.setv({axis_line_color: c.axis, major_tick_line_color: c.axis, major_label_text_color: c.ink,
                   axis_label_text_color: c.ink});
        if (part.minor_tick_line_color != null) part.minor_tick_line_color = c.axis;
      } else if ('grid_line_color' in part) {
        if (part.grid_line_color != null) part.grid_line_color = c.grid;
      } else if ('label_text_color' in part) {
        part.setv({label_text_color: c.ink, background_fill_color: c.plot, border_line_color: c.grid});
      }
    }
    for (const renderer of plot.renderers) {  // lines drawn in the ink, edges in the background, by their tags
      const glyph = renderer.glyph;
      if (glyph && glyph.tags.includes('ink')) glyph.line_color = c.ink;
      if (glyph && glyph.tags.includes('edge')) glyph.line_color = c.plot;
    }
  }
};
paint();
new MutationObserver(paint).observe(document.documentElement, {attributes: true, attributeFilter: ['data-theme']});
"""


def curve_with_marker(**axes: Any) -> tuple[Any, ColumnDataSource, ColumnDataSource]:
    """The widgets' chart: one curve and a marker at the reader's own setting (sources filled by the page's JS)."""
    curve, here = ColumnDataSource(data=dict(x=[], y=[])), ColumnDataSource(data=dict(x=[], y=[]))
    plot = figure(height=280, sizing_mode="stretch_width", toolbar_location=None, **axes)
    plot.line("x", "y", source=curve, line_width=2)
    plot.scatter("x", "y", source=here, size=11, color="crimson")
    return plot, curve, here


def _control() -> dict:
    """A control's settings: light colours, the row's width. A stylesheet is a model of its figure's document, so
    each control gets its own (a figure built twice in one process would otherwise share one: Bokeh refuses)."""
    return dict(stylesheets=[InlineStyleSheet(css=THEMED_CONTROL_CSS)], sizing_mode="stretch_width", min_width=240)


# A padded seat-step: grey at low opacity reads as a light grey on the light page and a lighter dark grey on the
# dark one, so the batching figure needs no repainting when the reader switches the scheme.
PADDING_FILL = "rgba(128, 128, 128, 0.3)"
MAX_REPLIES = 40  # the batching figure schedules at most this many replies: more would stall the page

# The choices offered, each a labkit preset; the keys are what the page's selects hold.
FIGURE_MODELS = {"llama-8b": LESSON_LLAMA_8B, "qwen3-8b": MODELS["qwen3-8b"], "smollm2-135m": MODELS["smollm2-135m"]}
PLAN_MODELS = {**FIGURE_MODELS, "llama-70b": LLAMA_3_1_70B}  # the capacity plan also splits a model over GPUs
FIGURE_GPUS = {"sale-gpu": SALE_GPU, "friends-gpu": FRIENDS_GPU, **PRESETS}
REPLIES = [21, 5, 8, 47, 32, 35, 6, 3, 8, 37]  # book/batching.md's ten replies: 84 steps against 58 with five seats


def _numbers(preset) -> dict:
    """A preset's numbers (its name and notes stay in Python: the page needs only the figures)."""
    return {key: value for key, value in asdict(preset).items() if not isinstance(value, str)}


def _constants() -> str:
    """The presets as JavaScript constants, numbers exactly as labkit holds them."""
    data = {
        "MODELS": {key: dict(_numbers(model), hidden_size=hidden_size_of(model)) for key, model in PLAN_MODELS.items()},
        "GPUS": {key: _numbers(gpu) for key, gpu in FIGURE_GPUS.items()},
        "WEIGHT_BYTES": WEIGHT_BYTES,
        "KV_BYTES": KV_BYTES,
        "PALETTE": list(Category10_10),
        "MAX_REPLIES": MAX_REPLIES,
        "SCHEMES": SCHEMES,
        "PADDING_FILL": PADDING_FILL,
    }
    return "".join(f"const {name} = {json.dumps(value)};\n" for name, value in data.items())


def _wire(layout, widgets: list, args: dict, body: str):
    """Run ``body`` (with the formulas and presets in scope) when the page opens and when a widget moves;
    paint the plots in the page's colour scheme when it opens and whenever the scheme changes."""
    callback = CustomJS(args=args, code=FORMULAS_JS + _constants() + body)
    for widget in widgets:
        widget.js_on_change("value", callback)
    plots = list(layout.select({"type": Plot}))
    document = Document()  # the page's document runs the callbacks once it is ready, to draw the first picture
    document.add_root(layout)
    document.js_on_event(DocumentReady, callback)
    document.js_on_event(DocumentReady, CustomJS(args=dict(plots=plots), code=_constants() + PAINT_JS))
    return layout


def _select(title: str, options: dict, value: str, name: str) -> Select:
    options = [(key, item.name) for key, item in options.items()]
    return Select(title=title, value=value, options=options, name=name, **_control())


def _controls(*widgets) -> row:
    """Controls side by side on a wide screen, one under another on a narrow one."""
    return row(*widgets, stylesheets=[InlineStyleSheet(css=WRAPPING_ROW_CSS)], sizing_mode="stretch_width")


def _byte_options(table: dict) -> list:
    return [(key, f"{key}: {value:g} byte{'' if value == 1 else 's'}") for key, value in table.items()]


def kv_capacity_figure():
    """How many conversations fit in a GPU's memory beside the weights, for a chosen model, GPU and context."""
    model = _select("model", FIGURE_MODELS, "llama-8b", "model")
    gpu = _select("GPU", FIGURE_GPUS, "friends-gpu", "gpu")
    tokens = Slider(
        title="tokens per conversation", start=256, end=32768, step=256, value=8192, name="tokens", **_control()
    )
    fraction = Slider(
        title="share of memory vLLM may use", start=0.5, end=1.0, step=0.01, value=0.85, name="fraction", **_control()
    )
    weights = Select(
        title="bytes per weight", value="bf16", options=_byte_options(WEIGHT_BYTES), name="weights", **_control()
    )
    kv = Select(title="bytes per cached number", value="bf16", options=_byte_options(KV_BYTES), name="kv", **_control())
    answer = Div(text="", name="answer", styles=ANSWER_STYLE)
    plot, curve, here = curve_with_marker(x_axis_type="log", x_range=Range1d(256, 32768), y_range=Range1d(0, 1))
    plot.xaxis.axis_label, plot.yaxis.axis_label = "tokens per conversation", "conversations that fit"
    body = """
    const m = {...MODELS[model.value], bytes_per_param: WEIGHT_BYTES[weights.value],
               kv_bytes_per_value: KV_BYTES[kv.value]};
    const g = GPUS[gpu.value], share = Math.round(fraction.value * 100) / 100;
    const fit = conversationsThatFit(g.memory_bytes, share, m, tokens.value);
    const xs = Array.from({length: 61}, (_, i) => Math.round(256 * 2 ** (i / 60 * 7)));
    curve.data = {x: xs, y: xs.map(t => conversationsThatFit(g.memory_bytes, share, m, t))};
    plot.y_range.end = Math.max(1, ...curve.data.y) * 1.05;
    here.data = {x: [tokens.value], y: [fit]};
    const left = g.memory_bytes * share - m.parameters * m.bytes_per_param;
    answer.text = left <= 0 ? shown(0, 'No conversation fits', 'conversations') + ': the weights alone fill that memory.'
      : shown(fit, fmt(fit), 'conversations') + ` ${fit === 1 ? 'conversation fits' : 'conversations fit'}: `
        + `${fmt(left / 1e9, 1)} GB left for KV caches, `
        + `${fmt(tokens.value * kvBytesPerToken(m) / 1e6)} MB each (${fmt(kvBytesPerToken(m) / 1024)} KiB a token).`;
    """
    widgets = [model, gpu, tokens, fraction, weights, kv]
    args = dict(
        model=model,
        gpu=gpu,
        tokens=tokens,
        fraction=fraction,
        weights=weights,
        kv=kv,
        answer=answer,
        curve=curve,
        here=here,
        plot=plot,
    )
    layout = column(
        _controls(model, gpu),
        _controls(weights, kv),
        _controls(tokens, fraction),
        answer,
        plot,
        sizing_mode="stretch_width",
    )
    return _wire(layout, widgets, args, body)


def step_time_figure():
    """A decode pass's memory and arithmetic terms against batch size, and where arithmetic takes over."""
    model = _select("model", FIGURE_MODELS, "llama-8b", "model")
    gpu = _select("GPU", FIGURE_GPUS, "sale-gpu", "gpu")
    context = Slider(
        title="tokens of context per sequence", start=0, end=8192, step=50, value=1150, name="context", **_control()
    )
    batch = Slider(title="sequences in the pass", start=1, end=512, step=1, value=64, name="batch", **_control())
    answer = Div(text="", name="answer", styles=ANSWER_STYLE)
    terms, here = (
        ColumnDataSource(data=dict(b=[], memory=[], compute=[], step=[])),
        ColumnDataSource(data=dict(b=[], y=[])),
    )
    plot = figure(
        height=300, sizing_mode="stretch_width", toolbar_location=None, x_range=Range1d(1, 512), y_range=Range1d(0, 1)
    )
    plot.line("b", "memory", source=terms, line_width=2, color="#1f77b4", legend_label="moving weights + KV")
    plot.line("b", "compute", source=terms, line_width=2, color="darkorange", legend_label="arithmetic")
    plot.line("b", "step", source=terms, line_width=3, alpha=0.6, legend_label="the pass takes", tags=["ink"])
    plot.scatter("b", "y", source=here, size=10, color="crimson")
    critical = Span(dimension="height", line_dash="dashed", line_color="grey", location=1)
    plot.add_layout(critical)
    plot.legend.location = "top_left"
    plot.xaxis.axis_label, plot.yaxis.axis_label = "sequences in the decode pass", "ms per pass"
    body = """
    const m = MODELS[model.value], g = GPUS[gpu.value], c = context.value;
    const bs = Array.from({length: 512}, (_, i) => i + 1), t = bs.map(b => decodeTerms(g, m, b, c));
    terms.data = {b: bs, memory: t.map(x => x.memory * 1e3), compute: t.map(x => x.compute * 1e3),
                  step: t.map(x => Math.max(x.memory, x.compute) * 1e3)};
    const now = decodeTerms(g, m, batch.value, c), step = Math.max(now.memory, now.compute);
    here.data = {b: [batch.value], y: [step * 1e3]};
    plot.y_range.end = Math.max(...terms.data.step) * 1.05;
    const star = criticalBatch(g, m), cross = decodeCrossover(g, m, c);
    critical.location = star;
    answer.text = `${counted(batch.value, 'sequence')}: memory term ` + shown(now.memory * 1e3, fmt(now.memory * 1e3, 2), 'memory')
      + ' ms, arithmetic term ' + shown(now.compute * 1e3, fmt(now.compute * 1e3, 2), 'compute')
      + ` ms, so the pass is ${now.memory >= now.compute ? 'memory' : 'arithmetic'}-bound. Critical batch (dashed): `
      + shown(star, fmt(star), 'critical') + ' tokens. With this context decode '
      + (cross === Infinity ? shown('Infinity', 'never', 'crossover') + ' turns arithmetic-bound.'
         : 'turns arithmetic-bound beyond ' + shown(cross, fmt(cross), 'crossover') + (fmt(cross) === '1' ? ' sequence.' : ' sequences.'));
    """
    args = dict(
        model=model,
        gpu=gpu,
        context=context,
        batch=batch,
        answer=answer,
        terms=terms,
        here=here,
        critical=critical,
        plot=plot,
    )
    layout = column(_controls(model, gpu), _controls(context, batch), answer, plot, sizing_mode="stretch_width")
    return _wire(layout, [model, gpu, context, batch], args, body)


def batching_figure():
    """The same replies under static and continuous batching: seats over steps, padding hatched."""
    seats = Slider(title="seats (sequences per batch)", start=1, end=10, step=1, value=5, name="seats", **_control())
    replies = TextInput(
        title="reply lengths, in tokens", value=", ".join(map(str, REPLIES)), name="replies", **_control()
    )
    answer = Div(text="", name="answer", styles=ANSWER_STYLE)
    steps = Range1d(0, 90)
    charts = [_seat_chart(policy, steps, int(seats.value)) for policy in ("static", "continuous")]
    plots, sources, seat_ticks = (list(part) for part in zip(*charts))
    plots[1].xaxis.axis_label = "decode step"
    body = """
    const words = replies.value.split(/[\\s,]+/).filter(s => s);
    const lengths = words.map(Number);
    const problem = !words.length ? 'Type at least one reply length.'
      : words.length > MAX_REPLIES ? `Type at most ${MAX_REPLIES} reply lengths (you typed ${words.length}).`
      : !words.every(w => /^[0-9]+$/.test(w) && Number(w) >= 1 && Number(w) <= 1000)
        ? 'Type whole numbers from 1 to 1000 (digits only), separated by commas.' : null;
    if (problem) {  // no schedule for bad input: the charts are cleared, not left showing the previous one
      sources.forEach(source => { source.data = {left: [], right: [], bottom: [], top: [], color: [], hatch: []}; });
      answer.text = problem;
      return;
    }
    const runs = [staticBatching(lengths, seats.value), continuousBatching(lengths, seats.value)];
    runs.forEach((run, i) => {
      const d = {left: [], right: [], bottom: [], top: [], color: [], hatch: []};
      const box = (left, right, seat, color, hatch) => {
        d.left.push(left); d.right.push(right); d.bottom.push(seat + 0.08); d.top.push(seat + 0.92);
        d.color.push(color); d.hatch.push(hatch);
      };
      for (const s of run.spans) {
        box(s.start, s.start + s.length, s.seat, PALETTE[s.request % PALETTE.length], ' ');
        if (s.padding) box(s.start + s.length, s.start + s.length + s.padding, s.seat, PADDING_FILL, '/');
      }
      sources[i].data = d;
      plots[i].y_range.end = seats.value;
      seatTicks[i].ticks = Array.from({length: seats.value}, (_, seat) => seat + 0.5);
    });
    steps.end = Math.max(runs[0].steps, runs[1].steps) + 2;
    answer.text = 'Static: ' + shown(runs[0].steps, runs[0].steps, 'static-steps') + ' steps, '
      + shown(runs[0].padded, runs[0].padded, 'static-padded') + ' padded seat-steps. Continuous: '
      + shown(runs[1].steps, runs[1].steps, 'continuous-steps') + ' steps, '
      + shown(runs[1].padded, runs[1].padded, 'continuous-padded') + ' padded.';
    """
    args = dict(
        seats=seats, replies=replies, answer=answer, steps=steps, plots=plots, sources=sources, seatTicks=seat_ticks
    )
    layout = column(_controls(seats, replies), answer, *plots, sizing_mode="stretch_width")
    return _wire(layout, [seats, replies], args, body)


def _seat_chart(policy: str, steps: Range1d, seats: int) -> tuple:
    """One policy's chart of seats over decode steps: the plot, the boxes' source, the seats' ticks."""
    source = ColumnDataSource(data=dict(left=[], right=[], bottom=[], top=[], color=[], hatch=[]))
    plot = figure(
        height=170,
        sizing_mode="stretch_width",
        x_range=steps,
        y_range=Range1d(0, 5),
        toolbar_location=None,
        title=f"{policy} batching",
    )
    plot.quad(
        "left",
        "right",
        "bottom",
        "top",
        source=source,
        fill_color="color",
        line_color="white",
        tags=["edge"],  # seats drawn apart by lines of the background's colour
        hatch_pattern="hatch",
        hatch_color="grey",
    )
    plot.yaxis.axis_label = "seat"
    # Seat s is drawn from s to s + 1: one tick in its middle, named by its number (1 to 5, never 2.5).
    ticks = FixedTicker(ticks=[seat + 0.5 for seat in range(seats)], minor_ticks=[])
    plot.yaxis.ticker = ticks
    plot.yaxis.formatter = CustomJSTickFormatter(code="return String(tick + 0.5);")
    plot.ygrid.grid_line_color = None  # a grid line would run through the middle of every seat's row
    return plot, source, ticks


def page_html(layout) -> str:
    """One figure as an HTML fragment for a chapter: BokehJS inlined (no CDN), the figure and its callbacks."""
    script, div = components(layout)
    return f'{RESOURCES.render_js()}{script}<div class="labkit-widget"><style>{WIDGET_CSS}</style>{div}</div>'
