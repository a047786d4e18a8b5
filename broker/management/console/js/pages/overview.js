// Overview: totals, live graphs of queued messages and message rates, nodes, listeners,
// and definitions export / import.
import * as api from "../api.js";
import { h, clear, num, rate, bytes, duration, detail, toast, errorText, download } from "../util.js";
import { chartCard, ratesFrom, spanSelect } from "../chart.js";
import { select } from "../forms.js";

// RabbitMQ's overview rate series (its "disk read/write" have no counterpart here)
const RATE_SERIES = [
  { key: "publish", label: "Publish", color: "#0d9488" },
  { key: "confirm", label: "Publisher confirm", color: "#6366f1" },
  { key: "deliver", label: "Deliver (manual ack)", color: "#f59e0b" },
  { key: "deliver_no_ack", label: "Deliver (auto ack)", color: "#eab308" },
  { key: "ack", label: "Consumer ack", color: "#ec4899" },
  { key: "redeliver", label: "Redelivered", color: "#ef4444" },
  { key: "get", label: "Get (manual ack)", color: "#8b5cf6" },
  { key: "get_no_ack", label: "Get (auto ack)", color: "#a855f7" },
  { key: "get_empty", label: "Get (empty)", color: "#94a3b8" },
  { key: "return_unroutable", label: "Unroutable (return)", color: "#78716c" },
  { key: "drop_unroutable", label: "Unroutable (drop)", color: "#57534e" },
];
const CHURN_SERIES = [
  { key: "connection_created", label: "Connections opened", color: "#0d9488" },
  { key: "connection_closed", label: "Connections closed", color: "#14b8a6" },
  { key: "channel_created", label: "Channels opened", color: "#6366f1" },
  { key: "channel_closed", label: "Channels closed", color: "#a5b4fc" },
  { key: "queue_declared", label: "Queues declared", color: "#f59e0b" },
  { key: "queue_created", label: "Queues created", color: "#f97316" },
  { key: "queue_deleted", label: "Queues deleted", color: "#ef4444" },
];
const MEMORY_PARTS = [
  ["queue_procs", "Queues (message bodies)", "#0ea5e9"],
  ["connection_writers", "Connections (output buffers)", "#f97316"],
  ["other_proc", "Other", "#94a3b8"],
];
const QUEUED_SERIES = [
  { key: "messages_ready", label: "Ready", color: "#0ea5e9" },
  { key: "messages_unacknowledged", label: "Unacked", color: "#f97316" },
  { key: "messages", label: "Total", color: "#334155" },
];

function stat(label, value, id) {
  return h("div.stat", { id }, h("div.stat-value", value), h("div.stat-label", label));
}

export async function render(ctx) {
  const queued = chartCard({ id: "chart-queued", title: "Queued messages", series: QUEUED_SERIES,
    format: (v) => num(v) });
  const rates = chartCard({ id: "chart-rates", title: "Message rates", series: RATE_SERIES,
    format: (v, axis) => (axis ? `${num(v)}/s` : rate(v)) });
  const churn = chartCard({ id: "chart-churn", title: "Churn (per second)", series: CHURN_SERIES,
    format: (v, axis) => (axis ? `${num(v)}/s` : rate(v)) });
  const memory = h("div#memory-panel");
  const totals = h("div.stats");
  const nodes = h("div.table-wrap");
  const listeners = h("div.table-wrap");

  async function refresh() {
    // the first load asks for the API's samples too, so the graphs start with history
    const first = queued.empty() && rates.empty();
    const url = first ? "/api/overview?lengths_age=600&lengths_incr=5&msg_rates_age=600&msg_rates_incr=5" : "/api/overview";
    const [ov, nodeList] = await Promise.all([api.get(url), ctx.can("monitoring") ? api.get("/api/nodes").catch(() => []) : []]);
    const now = Date.now() / 1000;
    const qt = ov.queue_totals || {}, ms = ov.message_stats || {}, ot = ov.object_totals || {};
    if (first) seed(ov, queued, rates, churn);
    // a counter the broker does not report is a gap, not a zero (an idle RabbitMQ reports none)
    const none = Object.keys(ms).length === 0 ? 0 : null;
    queued.add(now, QUEUED_SERIES.map((s) => qt[s.key] ?? 0));
    rates.add(now, RATE_SERIES.map((s) => detail(ms, s.key) ?? none));
    const cr = ov.churn_rates || {};
    churn.add(now, CHURN_SERIES.map((s) => detail(cr, s.key) ?? null));
    clear(totals,
      stat("Connections", num(ot.connections ?? 0), "total-connections"),
      stat("Channels", num(ot.channels ?? 0), "total-channels"),
      stat("Exchanges", num(ot.exchanges ?? 0), "total-exchanges"),
      stat("Queues", num(ot.queues ?? 0), "total-queues"),
      stat("Consumers", num(ot.consumers ?? 0), "total-consumers"),
      stat("Messages", num(qt.messages ?? 0), "total-messages"),
      stat("Publish rate", rate(detail(ms, "publish") ?? 0), "publish-rate"));
    const list = Array.isArray(nodeList) ? nodeList : [];
    clear(nodes, h("table.data", h("thead", h("tr", ["Name", "Memory", "File descriptors", "Sockets", "Disk free", "Uptime", "Alarms"].map((x) => h("th", x)))),
      h("tbody", list.length ? list.map((n) => h("tr",
        h("td", n.name), h("td", bytes(n.mem_used), n.mem_limit ? h("small.muted", ` of ${bytes(n.mem_limit)}`) : ""),
        h("td", num(n.fd_used), n.fd_total ? h("small.muted", ` of ${num(n.fd_total)}`) : ""),
        h("td", num(n.sockets_used), n.sockets_total ? h("small.muted", ` of ${num(n.sockets_total)}`) : ""),
        h("td", bytes(n.disk_free)), h("td", duration((n.uptime ?? 0) / 1000)),
        h("td", n.mem_alarm || n.disk_free_alarm ? h("span.pill.pill-bad", [n.mem_alarm && "memory", n.disk_free_alarm && "disk"].filter(Boolean).join(", ")) : h("span.pill.pill-on", "none"))))
        : h("tr.empty", h("td", { colSpan: 7 }, "No node information")))));
    if (list.length) await renderMemory(memory, list[0].name);
    clear(listeners, h("table.data", h("thead", h("tr", ["Protocol", "Bound to", "Port"].map((x) => h("th", x)))),
      h("tbody", (ov.listeners || []).map((l) => h("tr", h("td", l.protocol), h("td", l.ip_address), h("td.num", l.port))))));
  }

  await refresh().catch((e) => toast(errorText(e), "error"));

  const el = h("div.page",
    h("div.page-head", h("h1", "Overview"), spanSelect([queued, rates, churn])),
    totals,
    h("div.grid-2", queued.el, rates.el),
    h("div.grid-2", churn.el, ctx.can("monitoring") ? h("section.card", h("h2", "Memory"), memory) : null),
    ctx.can("monitoring") ? h("section.card", h("h2", "Nodes"), nodes) : null,
    h("section.card", h("h2", "Listeners"), listeners),
    definitionsCard(ctx));
  return {
    el, refresh,
    mounted() { queued.render(); rates.render(); churn.render(); },
    stop() { queued.stop(); rates.stop(); churn.stop(); },
  };
}

// Seeds the graphs from the API's samples: TrioMQ's ring of counters ("samples") or RabbitMQ's
// <key>_details.samples (newest first). Rates are the counters' differences over time.
function samplesOf(ov, section, key) {
  if (Array.isArray(ov.samples)) {
    return ov.samples.filter((x) => typeof x[key] === "number").map((x) => ({ t: x.timestamp / 1000, v: x[key] }));
  }
  const list = ov[section]?.[`${key}_details`]?.samples || [];
  return list.map((x) => ({ t: x.timestamp / 1000, v: x.sample })).sort((a, b) => a.t - b.t);
}

// The node's memory, as RabbitMQ's node page breaks it down (?memory=true): a bar of the parts
// and the total against the limit at which the memory alarm goes off.
async function renderMemory(box, node) {
  let m;
  try {
    m = (await api.get(`/api/nodes/${api.enc(node)}?memory=true`)).memory;
  } catch { return; }
  if (!m) return clear(box, h("p.muted", "No memory breakdown"));
  const total = m.total?.rss ?? m.total?.allocated ?? 0;
  const parts = MEMORY_PARTS.filter(([k]) => typeof m[k] === "number");
  const bar = h("div.memory-bar", parts.map(([k, label, color]) => {
    const el = h("i", { title: `${label}: ${bytes(m[k])}` });
    el.style.background = color;
    el.style.width = `${total ? (100 * m[k]) / total : 0}%`;
    return el;
  }));
  clear(box, h("div.stat-value#memory-total", bytes(total)), bar,
    h("table.data", h("tbody", parts.map(([k, label]) => h("tr", { dataset: { part: k } }, h("td", label), h("td.num", bytes(m[k])))))));
}

function seed(ov, queued, rates, churn) {
  const fill = (chart, columns) => {
    const maps = columns.map((c) => new Map(c.map((p) => [p.t, p.v])));
    const times = [...new Set(columns.flat().map((p) => p.t))].sort((a, b) => a - b);
    for (const t of times) chart.add(t, maps.map((m) => m.get(t) ?? null));
  };
  fill(queued, QUEUED_SERIES.map((s) => samplesOf(ov, "queue_totals", s.key)));
  fill(rates, RATE_SERIES.map((s) => ratesFrom(samplesOf(ov, "message_stats", s.key))));
  fill(churn, CHURN_SERIES.map((s) => ratesFrom(samplesOf(ov, "churn_rates", s.key))));
}

// Definitions: download the broker's (or one vhost's) definitions; upload a file to import.
function definitionsCard(ctx) {
  if (!ctx.isAdmin()) return null;
  const scope = select("scope", [["", "All virtual hosts"], ...ctx.vhosts.map((v) => [v, v])], "");
  scope.setAttribute("aria-label", "Definitions scope");
  const file = h("input#definitions-file", { type: "file", accept: ".json,application/json", "aria-label": "Definitions file" });
  const result = h("div.muted#definitions-result");
  const url = () => (scope.value ? `/api/definitions/${api.enc(scope.value)}` : "/api/definitions");

  const exportBtn = h("button.btn#export-definitions", { type: "button", on: { click: async () => {
    try {
      const defs = await api.get(url());
      const stamp = new Date().toISOString().slice(0, 19).replace(/[:T]/g, "-");
      const host = (ctx.overview?.cluster_name || "triomq").replace(/[^\w.-]+/g, "_");
      download(`${host}_${stamp}.json`, JSON.stringify(defs, null, 2));
      clear(result, "Definitions downloaded.");
    } catch (e) { toast(errorText(e), "error"); }
  } } }, "Download definitions");

  const importBtn = h("button.btn.btn-primary#import-definitions", { type: "button", on: { click: async () => {
    const f = file.files[0];
    if (!f) return toast("Choose a definitions file first", "error");
    let body;
    try {
      body = JSON.parse(await f.text());
    } catch (e) {
      return toast(`${f.name} is not valid JSON: ${e.message}`, "error");
    }
    importBtn.disabled = true;
    try {
      await api.post(url(), body);
      clear(result, `Imported ${f.name}.`);
      toast("Definitions imported");
      await ctx.reloadHeader();
    } catch (e) {
      clear(result, `Import failed, nothing was changed: ${errorText(e)}`);
      toast(errorText(e), "error");
    } finally { importBtn.disabled = false; }
  } } }, "Upload definitions");

  return h("section.card#definitions", h("h2", "Definitions"),
    h("p.muted", "Users, virtual hosts, permissions, policies, exchanges, queues and bindings, in RabbitMQ's definitions format."),
    h("div.row", h("label.inline", "Scope ", scope)),
    h("div.split",
      h("div", h("h3", "Export"), exportBtn),
      h("div", h("h3", "Import"), h("div.row", file, importBtn))),
    result);
}
