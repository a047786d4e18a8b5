// Live time-series charts (uPlot, vendored). A chart's history lives in memory for the page's
// life, so leaving and returning to a page keeps it; the overview seeds it from the API's samples.
import { h } from "./util.js";
import { select } from "./forms.js";

const KEEP_SECONDS = 3600;
const histories = new Map();
const SPAN_KEY = "triomq.span";
export const SPANS = [[60, "Last minute"], [600, "Last 10 minutes"], [3600, "Last hour"]];

export function span() {
  return Number(sessionStorage.getItem(SPAN_KEY) || "600");
}

export function setSpan(seconds) {
  sessionStorage.setItem(SPAN_KEY, String(seconds));
}

export function history(id, names) {
  if (!histories.has(id)) histories.set(id, { names, t: [], values: names.map(() => []) });
  return histories.get(id);
}

export function push(hist, seconds, values) {
  if (hist.t.length && seconds <= hist.t[hist.t.length - 1]) return;
  hist.t.push(seconds);
  values.forEach((v, i) => hist.values[i].push(v ?? null));
  while (hist.t.length && hist.t[0] < seconds - KEEP_SECONDS) {
    hist.t.shift();
    hist.values.forEach((a) => a.shift());
  }
}

// Colours are set through the CSSOM, which a Content-Security-Policy without 'unsafe-inline'
// still allows (a style attribute it would block).
function swatch(color) {
  const el = h("i.swatch");
  el.style.background = color;
  return el;
}

const pad = (n) => String(n).padStart(2, "0");
function clock(seconds, withSeconds) {
  const d = new Date(seconds * 1000);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}${withSeconds ? `:${pad(d.getSeconds())}` : ""}`;
}

// A chart card: title, a uPlot canvas and a legend with the latest value of each series.
// series: [{label, color}]; format(value, axis) -> text. The element carries data-points (samples
// held) and data-latest (JSON of the last values) for tests and scripts.
export function chartCard({ id, title, series, format }) {
  const hist = history(id, series.map((s) => s.label));
  const plotBox = h("div.plot");
  const legend = h("div.legend", series.map((s, i) => h("span.legend-item", { dataset: { series: s.label } },
    swatch(s.color), s.label, ": ", h("b.legend-value", { dataset: { index: i } }, "–"))));
  const el = h(`section.card.chart-card#${id}`, h("div.chart-head", h("h2", title), legend), plotBox);
  let plot = null;

  function size() {
    return { width: Math.max(280, plotBox.clientWidth || 560), height: 210 };
  }

  function build() {
    const axis = { stroke: "#64748b", grid: { stroke: "#eef2f7" }, ticks: { stroke: "#e2e8f0" }, font: "11px system-ui, sans-serif" };
    const opts = {
      ...size(),
      cursor: { drag: { x: false, y: false } },
      legend: { show: false },
      // the chosen span on x, and at least 0..5 on y, so a new or idle chart has sensible ticks
      scales: {
        x: { time: true, range: (u, min, max) => { const end = Math.max(max ?? 0, Date.now() / 1000); return [end - span(), end]; } },
        y: { range: (u, min, max) => [0, Math.max((max ?? 0) * 1.15, 5)] },
      },
      axes: [
        { ...axis, values: (u, splits) => splits.map((s) => clock(s, span() <= 60)) },
        { ...axis, size: 64, values: (u, splits) => splits.map((v) => format(v, true)) },
      ],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, fill: `${s.color}14`, points: { show: false }, spanGaps: false }))],
    };
    plot = new window.uPlot(opts, [hist.t, ...hist.values], plotBox);
  }

  function render() {
    el.dataset.points = String(hist.t.length);
    const last = hist.values.map((a) => a[a.length - 1] ?? null);
    el.dataset.latest = JSON.stringify(last);
    el.querySelectorAll(".legend-value").forEach((b, i) => { b.textContent = last[i] == null ? "–" : format(last[i]); });
    if (!window.uPlot) return;
    if (!plot && plotBox.isConnected) build();
    else if (plot) plot.setData([hist.t, ...hist.values]);
  }

  const onResize = () => plot && plot.setSize(size());
  window.addEventListener("resize", onResize);

  return {
    el,
    empty: () => hist.t.length === 0,
    add(seconds, values) { push(hist, seconds, values); render(); },
    render,
    redraw() { plot?.destroy(); plot = null; render(); },
    stop() { window.removeEventListener("resize", onResize); plot?.destroy(); plot = null; },
  };
}

// Rates from cumulative counter samples [{t: seconds, v: count}] (ascending): one per interval.
export function ratesFrom(samples) {
  const out = [];
  for (let i = 1; i < samples.length; i++) {
    const dt = samples[i].t - samples[i - 1].t;
    if (dt > 0) out.push({ t: samples[i].t, v: Math.max(0, (samples[i].v - samples[i - 1].v) / dt) });
  }
  return out;
}

// The "Graphs: last minute / 10 minutes / hour" choice, shared by every chart of the tab.
export function spanSelect(charts) {
  const sel = select("span", SPANS.map(([v, l]) => [String(v), l]), String(span()));
  sel.id = "chart-span";
  sel.setAttribute("aria-label", "Graph time span");
  sel.addEventListener("change", () => {
    setSpan(Number(sel.value));
    charts.forEach((c) => c.redraw());
  });
  return h("label.inline.muted", "Graphs ", sel);
}

// Seeds a chart of lengths from RabbitMQ's <key>_details.samples (newest first), when present.
export function seedLengths(chart, obj, keys) {
  const columns = keys.map((k) => new Map((obj?.[`${k}_details`]?.samples || []).map((x) => [x.timestamp / 1000, x.sample])));
  const times = [...new Set(columns.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  for (const t of times) chart.add(t, columns.map((m) => m.get(t) ?? null));
}
