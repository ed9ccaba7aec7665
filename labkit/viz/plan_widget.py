"""Chapter 8's capacity plan as a figure the reader changes in the page: ``labkit plan`` in the browser.

Why: the chapter works one plan by hand and says "change any input"; on a built page there is
no Python to change it with. ``PLANNER_JS`` repeats, operation for operation, what
:func:`labkit.capacity.plan` and :func:`labkit.capacity.size_fleet` compute (the tensor split,
the conversations that fit, the decode step and prefill, the ceiling, the price and the load
that keeps the promise), so the page's numbers equal the planner's; tests/test_interactive_figures.py
holds them to it over a grid of settings and tests/test_browser_interactive.py through the page.
The memory share, overhead per pass and price are the worked example's (``SALE_EXAMPLE``).
"""

from __future__ import annotations

import json

from bokeh.layouts import column
from bokeh.models import Div, Range1d, Select, Span, TextInput

from labkit.capacity import KV_BYTES, SALE_EXAMPLE, WEIGHT_BYTES
from labkit.capacity.parallel import GPUS_PER_NODE
from labkit.sim.hardware import ACHIEVABLE_FLOPS_FRACTION
from labkit.viz.interactive import (
    ANSWER_STYLE,
    FIGURE_GPUS,
    PLAN_MODELS,
    _byte_options,
    _control,
    _controls,
    _select,
    _wire,
    curve_with_marker,
)

# The example's figures the page keeps fixed, and the bounds of what a reader may type.
FIXED = dict(
    memory_fraction=SALE_EXAMPLE["memory_fraction"],
    overhead_s=SALE_EXAMPLE["overhead_s"],
    price_per_gpu_hour=SALE_EXAMPLE["price_per_gpu_hour"],
)
FLEET_WAYS = (1, 2, 4, 8)  # the tensor-parallel sizes `labkit plan --load` tries
BOUNDS = dict(prompt=(1, 200_000), answer=(1, 200_000), promise=(1, 10_000), load=(0.01, 100_000))

PLANNER_JS = """
class PlanError extends Error {}  // what labkit's planner refuses with a ValueError

// labkit.capacity.parallel.fewest_ways_that_fit: the smallest split at which one conversation fits
function fewestWaysThatFit(gpuBytes, fraction, m, tokens) {
  const usable = gpuBytes * fraction;
  for (let ways = 1; ways <= GPUS_PER_NODE; ways++) {
    if (m.kv_heads % ways && ways % m.kv_heads) continue;
    const kvPerGpu = kvBytesPerToken(m) * Math.max(1, Math.floor(m.kv_heads / ways)) / m.kv_heads;
    if (usable - m.parameters * m.bytes_per_param / ways >= tokens * kvPerGpu) return ways;
  }
  return null;
}

// labkit.capacity.parallel.does_not_fit: why nothing fits, and the fix
function doesNotFit(g, fraction, m, shard, ways, tokens) {
  const where = `${fmt(fraction * 100)}% of ${fmt(g.memory_bytes / 1e9, 1)} GB`;
  const problem = shard.parameters * shard.bytes_per_param >= g.memory_bytes * fraction
    ? `The weights (${fmt(shard.parameters * shard.bytes_per_param / 1e9, 1)} GB`
      + (ways > 1 ? ` per GPU, split ${ways} ways` : '') + `) do not fit in ${where}`
    : `Not one conversation of ${fmt(tokens)} tokens fits beside the weights`
      + (ways > 1 ? ` on each of ${ways} GPUs` : '') + ` (${where})`;
  const fewest = fewestWaysThatFit(g.memory_bytes, fraction, m, tokens);
  const more = fewest !== null && fewest > ways ? `split the model over ${fewest} GPUs, ` : '';
  return new PlanError(`${problem}: ${more}store fewer bytes per weight or per cached number, `
    + 'shorten the prompt or answer, or pick a GPU with more memory.');
}

// labkit.capacity.parallel.tensor_split: what one GPU of a replica holds, and its all-reduce seconds per token
function tensorSplit(g, m, ways) {
  if (ways === 1) return {shard: m, allreduce: 0};
  if (m.kv_heads % ways && ways % m.kv_heads)
    throw new PlanError(`${ways} GPUs cannot share the model's ${m.kv_heads} KV heads evenly: `
      + `pick a number of GPUs that divides ${m.kv_heads}.`);
  if (!(g.interconnect_bandwidth > 0))
    throw new PlanError(`This GPU has no known link between cards, so a model split ${ways} ways `
      + 'cannot be timed: pick 1 GPU per replica.');
  const shard = {...m, parameters: m.parameters / ways, kv_heads: Math.max(1, Math.floor(m.kv_heads / ways)),
                 query_heads: m.query_heads === null ? null : Math.max(1, Math.floor(m.query_heads / ways))};
  const messageBytes = 2 * (ways - 1) / ways * m.hidden_size * 2;
  return {shard, allreduce: m.layers * 2 * messageBytes / g.interconnect_bandwidth};
}

// labkit.capacity.planner.plan, one replica of `ways` GPUs; seconds, bytes and requests/s as labkit holds them
// labkit.sim.hardware.Hardware.achievable: every GPU rated alike, arithmetic at half a datasheet peak
function achievable(g) {
  return g.flops_achievable ? g : {...g, flops: g.flops * ACHIEVABLE_FLOPS_FRACTION, flops_achievable: true};
}

// labkit.capacity.planner.plan, one replica of `ways` GPUs; seconds, bytes and requests/s as labkit holds them
function planCapacity(gpu, m, prompt, answer, fraction, overhead, promise, price, ways) {
  const g = achievable(gpu), tokens = prompt + answer;
  if (m.context_length !== null && tokens > m.context_length)
    throw new PlanError(`The model reads at most ${fmt(m.context_length)} tokens (its context length); `
      + `${fmt(prompt)} + ${fmt(answer)} make ${fmt(tokens)}: shorten them or pick a model with a longer context.`);
  const {shard, allreduce} = tensorSplit(g, m, ways);
  const weightBytes = shard.parameters * shard.bytes_per_param, kv = kvBytesPerToken(shard);
  const flopsPerToken = 2 * shard.parameters;
  if (weightBytes >= g.memory_bytes * fraction) throw doesNotFit(g, fraction, m, shard, ways, tokens);
  const conversations = Math.floor((g.memory_bytes * fraction - weightBytes) / (tokens * kv));
  if (conversations < 1) throw doesNotFit(g, fraction, m, shard, ways, tokens);
  // CostModel.pass_breakdown: bytes over the link, arithmetic at the rate; the larger, plus the overhead
  const pass = (newTokens, context) => {
    const memory = (weightBytes + kv * context) / g.bandwidth, compute = flopsPerToken * newTokens / g.flops;
    return {memory, compute, total: Math.max(memory, compute) + overhead};
  };
  const meanContext = prompt + answer / 2, step = pass(conversations, conversations * meanContext);
  const decodeStep = step.total + allreduce * conversations;
  // ModelSpec.prefill_attention_flops: 2 x layers x heads x head_dim x L(L + 1), on top of the weights' arithmetic
  const attention = shard.query_heads === null ? null
    : 2 * shard.layers * shard.query_heads * shard.head_dim * prompt * (prompt + 1) / g.flops;
  const pre = pass(prompt, 0);
  const prefill = Math.max(pre.memory, pre.compute + (attention ?? 0)) + overhead + allreduce * prompt;
  const decodePerRequest = answer * decodeStep / conversations, gpuPerRequest = prefill + decodePerRequest;
  const ceiling = 1 / gpuPerRequest, tokensPerS = ceiling * answer, decodeShare = decodePerRequest / gpuPerRequest;
  const p = {
    conversations, kv_budget_bytes: g.memory_bytes * fraction - weightBytes,
    kv_bytes_per_conversation: tokens * kv, weight_bytes_per_gpu: weightBytes,
    single_stream_tokens_per_s: g.bandwidth / weightBytes,
    critical_batch: g.flops / g.bandwidth * weightBytes / flopsPerToken, mean_context: meanContext,
    decode_memory_s: step.memory, decode_compute_s: step.compute, decode_step_s: decodeStep, prefill_s: prefill,
    prefill_attention_s: attention, flops: g.flops,
    gpu_s_per_request: gpuPerRequest, request_ceiling_per_s: ceiling, tokens_per_s: tokensPerS,
    cost_per_million_tokens: price * ways / 3600 / tokensPerS * 1e6, decode_share: decodeShare,
    token_interval_s: decodeStep / decodeShare, promise_load_per_s: null, promise_in_flight: null,
    tensor_parallel: ways, allreduce_s_per_token: allreduce,
    stepAt: b => { const t = pass(b, b * meanContext); return t.total + allreduce * b; },
  };
  p.speedup_over_single_stream = p.tokens_per_s / p.single_stream_tokens_per_s;
  if (promise === null) return p;
  // labkit.capacity.planner.load_within_promise: the smaller of the memory and arithmetic bounds on the load
  const weightRead = weightBytes / g.bandwidth;
  if (promise <= weightRead + overhead)
    throw new PlanError(`No load keeps a token every ${fmt(promise * 1e3, 1)} ms: a decode step already takes `
      + `${fmt((weightRead + overhead) * 1e3, 1)} ms to read the weights. Promise more, split the model `
      + 'over more GPUs or store fewer bytes per weight.');
  const kvPerSequence = meanContext * kv / g.bandwidth + allreduce;
  const computePerSequence = flopsPerToken / g.flops + allreduce;
  const memoryBound = (promise - weightRead - overhead) / (answer * promise * kvPerSequence + promise * prefill);
  const computeBound = (promise - overhead) / (answer * promise * computePerSequence + promise * prefill);
  let load = Math.min(memoryBound, computeBound), inFlight = load * answer * promise;
  if (inFlight >= conversations) [load, inFlight] = [ceiling, conversations];  // memory binds before the promise
  p.promise_load_per_s = load;
  p.promise_in_flight = inFlight;
  p.promise_capacity_cost = 1 - load / ceiling;
  return p;
}

// labkit.capacity.fleet.size_fleet: for each split, the replicas that carry `load`; the fewest GPUs wins
function sizeFleet(load, g, m, prompt, answer, fraction, overhead, promise, price) {
  const options = FLEET_WAYS.map(ways => {
    try {
      const replica = planCapacity(g, m, prompt, answer, fraction, overhead, promise, price, ways);
      const carried = replica.promise_load_per_s === null ? replica.request_ceiling_per_s : replica.promise_load_per_s;
      const replicas = Math.max(1, Math.ceil(load / carried - 1e-9));
      return {ways, replicas, gpus: ways * replicas, spare: -carried * replicas};
    } catch (error) {
      if (!(error instanceof PlanError)) throw error;
      return {ways, why: error.message};
    }
  });
  const fitting = options.filter(o => o.gpus !== undefined);
  if (!fitting.length) throw new PlanError(options[0].why);
  const best = fitting.reduce((a, b) => b.gpus < a.gpus || (b.gpus === a.gpus && b.spare < a.spare) ? b : a);
  return {options, best};
}
"""

# What the page does with the reader's inputs: check them, plan, size the fleet, write the table, draw the curve.
BODY_JS = """
const fields = {prompt: prompt.value, answer: answer.value, promise: promise.value, load: load.value};
const whole = /^[0-9]+$/, decimal = /^[0-9]+(\\.[0-9]+)?$/, problems = [], v = {};
for (const [key, text] of Object.entries(fields)) {
  const t = text.trim(), [low, high] = BOUNDS[key], integer = key === 'prompt' || key === 'answer';
  if (!t && !integer) { v[key] = null; continue; }  // no promise, no load: those parts are left out
  if (!(integer ? whole : decimal).test(t) || Number(t) < low || Number(t) > high)
    problems.push(`${LABELS[key]}: type ${integer ? 'a whole number' : 'a number'} from ${fmt(low, low < 1 ? 2 : 0)} `
      + `to ${fmt(high)} (digits${integer ? '' : ' and one decimal point'} only)${integer ? '' : ', or leave it empty'}.`);
  v[key] = Number(t);
}
const clear = message => {  // bad input or no plan: nothing left over from the last plan
  curve.data = {x: [], y: []}; here.data = {x: [], y: []}; promiseLine.visible = false;
  table.text = `<p data-problem="yes" style="color: var(--labkit-problem, #b3261e); font-weight: 600">${message}</p>`;
};
if (problems.length) { clear(problems.join('<br>')); return; }
const g = GPUS[gpu.value];
const m = {...MODELS[model.value], bytes_per_param: WEIGHT_BYTES[weights.value], kv_bytes_per_value: KV_BYTES[kv.value]};
const promiseS = v.promise === null ? null : v.promise / 1e3, ways = Number(tp.value);
const inputs = [g, m, v.prompt, v.answer, FIXED.memory_fraction, FIXED.overhead_s, promiseS, FIXED.price_per_gpu_hour];
let p, fleet = null;
try {
  p = planCapacity(...inputs, ways);
  if (v.load !== null) fleet = sizeFleet(v.load, ...inputs);
} catch (error) {
  if (!(error instanceof PlanError)) throw error;
  clear(error.message);
  return;
}
const ms = (name, digits = 1) => shown(p[name], fmt(p[name] * 1e3, digits), name) + ' ms';
const rate = name => shown(p[name], p[name] >= 1 ? fmt(p[name], 1) : p[name].toPrecision(2), name);
const perGpu = ways > 1 ? ', each GPU' : '';
const rows = [
  ['How many conversations fit'],
  ['memory left for KV caches' + perGpu, shown(p.kv_budget_bytes, fmt(p.kv_budget_bytes / 1e9, 1), 'kv_budget_bytes') + ' GB'],
  ['KV cache of one conversation' + perGpu,
   shown(p.kv_bytes_per_conversation, fmt(p.kv_bytes_per_conversation / 1e6), 'kv_bytes_per_conversation') + ' MB'],
  ['conversations that fit', shown(p.conversations, fmt(p.conversations), 'conversations')],
  ['How fast, and how much'],
  ['arithmetic rate (every GPU at half its datasheet peak, the rate kernels reach)', fmt(p.flops / 1e12, 1) + ' TFLOP/s'],
  ['decode step, all on board', ms('decode_step_s') + ` (${p.decode_memory_s >= p.decode_compute_s ? 'memory' : 'arithmetic'}-bound: `
   + ms('decode_memory_s') + ' against ' + ms('decode_compute_s') + ')'],
  ['prefill of one prompt', ms('prefill_s') + (p.prefill_attention_s === null ? ''
   : ', attention ' + ms('prefill_attention_s') + ' of it')],
  ['GPU time per request', ms('gpu_s_per_request')],
  ['request ceiling', rate('request_ceiling_per_s') + ' requests/s'],
  ['output tokens', shown(p.tokens_per_s, fmt(p.tokens_per_s), 'tokens_per_s') + ' tokens/s ('
   + shown(p.speedup_over_single_stream, fmt(p.speedup_over_single_stream, 1), 'speedup_over_single_stream')
   + '× one stream)'],
  [`cost at $${fmt(FIXED.price_per_gpu_hour, 2)} per GPU-hour`,
   '$' + shown(p.cost_per_million_tokens, fmt(p.cost_per_million_tokens, 3), 'cost_per_million_tokens')
   + ' per million output tokens'],
  ['The promise to users'],
  ['decode share of GPU time', shown(p.decode_share, fmt(p.decode_share * 100) + '%', 'decode_share')],
  ["time between a user's tokens at the ceiling", ms('token_interval_s', 0)],
];
if (promiseS !== null) rows.push(
  [`load that keeps a token every ${fmt(v.promise, 1)} ms`, rate('promise_load_per_s') + ' requests/s'],
  ['conversations in flight at that load', shown(p.promise_in_flight, fmt(p.promise_in_flight), 'promise_in_flight')],
  ['capacity the promise costs', shown(p.promise_capacity_cost, fmt(p.promise_capacity_cost * 100) + '%', 'promise_capacity_cost')]);
if (fleet) {
  rows.push([`A fleet for ${fmt(v.load, 2)} requests/s` + (promiseS === null ? ' at the ceiling' : ' within the promise')]);
  for (const o of fleet.options) rows.push([`${o.ways} GPU${o.ways > 1 ? 's' : ''} per replica`, o.gpus === undefined
    ? `<span data-name="fleet-${o.ways}-gpus" data-value="none">does not fit</span>`
    : shown(o.replicas, fmt(o.replicas), `fleet-${o.ways}-replicas`) + (o.replicas === 1 ? ' replica, ' : ' replicas, ')
      + shown(o.gpus, fmt(o.gpus), `fleet-${o.ways}-gpus`) + ' GPUs' + (o === fleet.best ? ' (fewest)' : '')]);
  rows.push(['fewest GPUs', shown(fleet.best.gpus, fmt(fleet.best.gpus), 'fleet-best-gpus') + ', split '
    + shown(fleet.best.ways, fleet.best.ways, 'fleet-best-ways') + (fleet.best.ways === 1 ? ' way' : ' ways')]);
}
table.text = '<table style="border-collapse: collapse; width: 100%; font-size: 15px">' + rows.map(([label, value]) =>
  value === undefined ? `<tr><th colspan="2" style="text-align: left; padding: 8px 0 2px">${label}</th></tr>`
  : `<tr><td style="padding: 2px 12px 2px 0">${label}</td><td style="padding: 2px 0">${value}</td></tr>`).join('') + '</table>';
// The curve: B conversations on board are carried at B / (answer x step(B) + B x prefill) requests/s, and a user
// then waits step(B) / (1 - load x prefill) between tokens (labkit.capacity.planner.load_within_promise's algebra).
const count = Math.min(p.conversations, 200);
const bs = Array.from({length: count}, (_, i) => Math.max(1, Math.round((i + 1) * p.conversations / count)));
const loads = bs.map(b => b / (v.answer * p.stepAt(b) + b * p.prefill_s));
curve.data = {x: loads, y: bs.map((b, i) => p.stepAt(b) / (1 - loads[i] * p.prefill_s) * 1e3)};
here.data = p.promise_load_per_s === null ? {x: [], y: []} : {x: [p.promise_load_per_s], y: [v.promise]};
promiseLine.visible = promiseS !== null;
if (promiseS !== null) promiseLine.location = v.promise;
plot.x_range.end = p.request_ceiling_per_s * 1.05;
plot.y_range.start = Math.min(...curve.data.y, v.promise ?? Infinity) * 0.8;
plot.y_range.end = Math.max(...curve.data.y, v.promise ?? 0) * 1.25;
"""

LABELS = dict(prompt="prompt tokens", answer="answer tokens", promise="promise (ms)", load="load (requests/s)")


def planner_constants() -> str:
    """The planner's fixed figures and the input bounds as JavaScript constants (labkit's numbers exactly)."""
    data = dict(
        FIXED=FIXED,
        FLEET_WAYS=FLEET_WAYS,
        GPUS_PER_NODE=GPUS_PER_NODE,
        BOUNDS=BOUNDS,
        LABELS=LABELS,
        ACHIEVABLE_FLOPS_FRACTION=ACHIEVABLE_FLOPS_FRACTION,
    )
    return "".join(f"const {name} = {json.dumps(value)};\n" for name, value in data.items())


def _field(key: str, value: str, placeholder: str = "") -> TextInput:
    low, high = BOUNDS[key]
    return TextInput(
        title=f"{LABELS[key]}, {low:g} to {high:,}", value=value, placeholder=placeholder, name=key, **_control()
    )


def capacity_plan_figure():
    """Chapter 8's plan for a GPU, model, storage, lengths, promise and load the reader picks."""
    gpu = _select("GPU", FIGURE_GPUS, "sale-gpu", "gpu")
    model = _select("model", PLAN_MODELS, "llama-8b", "model")
    weights = Select(
        title="bytes per weight", value="bf16", options=_byte_options(WEIGHT_BYTES), name="weights", **_control()
    )
    kv = Select(title="bytes per cached number", value="bf16", options=_byte_options(KV_BYTES), name="kv", **_control())
    tp = Select(title="GPUs per replica", value="1", options=[str(n) for n in FLEET_WAYS], name="tp", **_control())
    prompt, answer = (
        _field("prompt", str(SALE_EXAMPLE["prompt_len"])),
        _field("answer", str(SALE_EXAMPLE["answer_len"])),
    )
    promise = _field("promise", f"{SALE_EXAMPLE['promise_s'] * 1e3:g}", "empty: no promise")
    load = _field("load", "", "empty: no fleet")
    table = Div(text="", name="plan", styles=ANSWER_STYLE, sizing_mode="stretch_width")
    plot, curve, here = curve_with_marker(y_axis_type="log", x_range=Range1d(0, 1), y_range=Range1d(1, 1000))
    promise_line = Span(dimension="width", line_dash="dotted", line_color="crimson", location=1, visible=False)
    plot.add_layout(promise_line)
    plot.xaxis.axis_label = "requests per second (one replica)"
    plot.yaxis.axis_label = "ms between a user's tokens"
    args = dict(
        gpu=gpu,
        model=model,
        weights=weights,
        kv=kv,
        tp=tp,
        prompt=prompt,
        answer=answer,
        promise=promise,
        load=load,
        table=table,
        curve=curve,
        here=here,
        promiseLine=promise_line,
        plot=plot,
    )
    layout = column(
        _controls(gpu, model),
        _controls(weights, kv, tp),
        _controls(prompt, answer),
        _controls(promise, load),
        table,
        plot,
        sizing_mode="stretch_width",
    )
    inputs = [gpu, model, weights, kv, tp, prompt, answer, promise, load]
    return _wire(layout, inputs, args, planner_constants() + PLANNER_JS + BODY_JS)
