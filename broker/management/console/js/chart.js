// Live time-series charts (uPlot, vendored). A Series keeps its samples in memory for the
// session's page life, so leaving and returning to a page keeps the history.
import { h } from "./util.js";

const KEEP = 240; // samples kept: 20 minutes at the default 5 s refresh
const histories = new Map();

export function history(id, names) {
  if (!histories.has(id)) histories.set(id, { names, t: [], values: names.map(() => []) });
  return histories.get(id);
}

export function push(hist, seconds, values) {
  if (hist.t.length && seconds <= hist.t[hist.t.length - 1]) return;
  hist.t.push(seconds);
  values.forEach((v, i) => hist.values[i].push(v ?? null));
  if (hist.t.length > KEEP) {
    hist.t.shift();
    hist.values.forEach((a) => a.shift());
  }
}

// A chart card: title, a uPlot canvas and a legend with the latest value of each series.
// series: [{label, color}]; format: value -> text.
export function chartCard({ id, title, series, format }) {
  const hist = history(id, series.map((s) => s.label));
  const plotBox = h("div.plot");
  const legend = h("div.legend", series.map((s, i) => h("span.legend-item", { dataset: { series: s.label } },
    h("i.swatch", { style: `background:${s.color}` }), s.label, ": ", h("b.legend-value", { dataset: { index: i } }, "–"))));
  const el = h(`section.card.chart-card#${id}`, h("div.chart-head", h("h2", title), legend), plotBox);
  let plot = null;

  function size() {
    return { width: Math.max(280, plotBox.clientWidth || 560), height: 210 };
  }

  function build() {
    const opts = {
      ...size(),
      cursor: { drag: { x: false, y: false } },
      legend: { show: false },
      // At least two minutes on x and 0..5 on y, so a new or idle chart has sensible ticks.
      scales: { x: { time: true, range: (u, min, max) => [Math.min(min ?? 0, (max ?? 0) - 120), max ?? 0] },
                y: { range: (u, min, max) => [0, Math.max((max ?? 0) * 1.15, 5)] } },
      axes: [
        { stroke: "#64748b", grid: { stroke: "#eef2f7" }, ticks: { stroke: "#e2e8f0" } },
        { stroke: "#64748b", grid: { stroke: "#eef2f7" }, ticks: { stroke: "#e2e8f0" }, size: 60,
          values: (u, vals) => vals.map((v) => format(v, true)) },
      ],
      series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, fill: `${s.color}1a`, points: { show: false } }))],
    };
    plot = new window.uPlot(opts, [hist.t, ...hist.values], plotBox);
  }

  function render() {
    el.dataset.points = String(hist.t.length);
    const last = hist.values.map((a) => a[a.length - 1]);
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
    add(seconds, values) { push(hist, seconds, values); render(); },
    render,
    stop() { window.removeEventListener("resize", onResize); plot?.destroy(); plot = null; },
  };
}
