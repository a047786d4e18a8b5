// Queues: the list with an add form, and one queue's page (details, graph, consumers, bindings,
// publish, get, purge, delete).
import * as api from "../api.js";
import { h, clear, num, rate, bytes, detail, args, yesno, tags, act, toast, errorText, confirmDialog } from "../util.js";
import { field, input, select, formCard, keyValueEditor, QUEUE_ARGUMENTS } from "../forms.js";
import { PagedTable } from "../table.js";
import { chartCard, seedLengths, spanSelect } from "../chart.js";
import { bindingsCard, publishCard } from "./exchanges.js";

export const queueHref = (q) => `#/queues/${api.enc(q.vhost)}/${api.enc(q.name)}`;

function features(q) {
  const a = q.arguments || {};
  return h("span.features",
    q.durable && h("abbr.feat", { title: "durable" }, "D"),
    q.auto_delete && h("abbr.feat", { title: "auto-delete" }, "AD"),
    q.exclusive && h("abbr.feat", { title: "exclusive" }, "Excl"),
    Object.keys(a).filter((k) => k !== "x-queue-type").map((k) => h("abbr.feat.feat-arg", { title: `${k}: ${JSON.stringify(a[k])}` }, shortArg(k))),
    q.policy && h("span.feat.feat-policy", { title: "policy" }, q.policy),
    q.operator_policy && h("span.feat.feat-policy", { title: "operator policy" }, q.operator_policy));
}

function shortArg(k) {
  const known = { "x-message-ttl": "TTL", "x-expires": "Exp", "x-max-length": "Lim", "x-max-length-bytes": "Lim B",
    "x-dead-letter-exchange": "DLX", "x-dead-letter-routing-key": "DLK", "x-max-priority": "Pri", "x-overflow": "Ovfl",
    "x-single-active-consumer": "SAC", "x-queue-mode": "Mode" };
  return known[k] || "Args";
}

function queueState(q) {
  const s = q.state || (q.idle_since ? "idle" : "running");
  return h(`span.pill${s === "running" ? ".pill-on" : s === "idle" ? "" : ".pill-warn"}`, s);
}

export async function renderList(ctx) {
  const table = new PagedTable({
    id: "queues-table",
    url: () => ctx.scoped("queues"),
    rowLink: (q) => queueHref(q),
    columns: [
      { key: "vhost", label: "Virtual host" },
      { key: "name", label: "Name", render: (q) => h("a.strong", { href: queueHref(q) }, q.name) },
      { key: "type", label: "Type", render: (q) => q.type || q.arguments?.["x-queue-type"] || "classic" },
      { key: "features", label: "Features", sort: false, render: features },
      { key: "state", label: "State", render: queueState },
      { key: "messages_ready", label: "Ready", num: true },
      { key: "messages_unacknowledged", label: "Unacked", num: true },
      { key: "messages", label: "Total", num: true },
      { key: "consumers", label: "Consumers", num: true },
      { key: "message_stats.publish_details.rate", label: "Incoming", num: true, render: (q) => rate(detail(q.message_stats, "publish") ?? 0) },
      { key: "message_stats.deliver_get_details.rate", label: "Deliver / get", num: true, render: (q) => rate(detail(q.message_stats, "deliver_get") ?? 0) },
      { key: "message_stats.ack_details.rate", label: "Ack", num: true, render: (q) => rate(detail(q.message_stats, "ack") ?? 0) },
    ],
  });
  await table.refresh();
  return { el: h("div.page", h("div.page-head", h("h1", "Queues")), table.el, addQueueForm(ctx, table)), refresh: () => table.refresh() };
}

function vhostSelect(ctx) {
  const vhosts = ctx.vhosts.length ? ctx.vhosts : ["/"];
  return select("vhost", vhosts, ctx.vhost || (vhosts.includes("/") ? "/" : vhosts[0]));
}

function addQueueForm(ctx, table) {
  const vhost = vhostSelect(ctx);
  const name = input("name", { required: true, placeholder: "orders" });
  const type = select("type", [["classic", "Classic"], ["quorum", "Quorum"], ["stream", "Stream"]], "classic");
  const durable = select("durable", [["true", "Durable"], ["false", "Transient"]], "true");
  const autoDelete = select("auto_delete", [["false", "No"], ["true", "Yes"]], "false");
  const argsEd = keyValueEditor("Arguments", QUEUE_ARGUMENTS);
  // quorum queues and streams are durable and never auto-delete (the broker refuses them)
  type.addEventListener("change", () => {
    const fixed = type.value !== "classic";
    if (fixed) { durable.value = "true"; autoDelete.value = "false"; }
    durable.disabled = autoDelete.disabled = fixed;
  });
  return formCard("Add a new queue", [
    field("Virtual host", vhost), field("Name", name), field("Type", type), field("Durability", durable),
    field("Auto delete", autoDelete), field("Arguments", argsEd),
  ], "Add queue", async (form, button) => {
    let a;
    try { a = argsEd.value(); } catch (e) { return toast(e.message, "error"); }
    if (type.value !== "classic") a["x-queue-type"] = type.value;
    const body = { durable: durable.value === "true", auto_delete: autoDelete.value === "true", arguments: a };
    const ok = await act(() => api.put(api.path`/api/queues/${vhost.value}/${name.value}`, body), `Queue ${name.value} added`, button);
    if (ok !== undefined) {
      name.value = "";
      await table.refresh();
    }
  }, { id: "add-queue" });
}

export async function renderOne(ctx, vhost, name) {
  const base = api.path`/api/queues/${vhost}/${name}`;
  const chart = chartCard({ id: `chart-queue-${vhost}-${name}`.replace(/[^\w-]/g, "_"), title: "Queued messages",
    series: [{ label: "Ready", color: "#0ea5e9" }, { label: "Unacked", color: "#f97316" }, { label: "Total", color: "#334155" }],
    format: (v) => num(v) });
  const RATES = [["publish", "Publish", "#0d9488"], ["deliver_get", "Deliver / get", "#f59e0b"],
    ["ack", "Consumer ack", "#ec4899"], ["redeliver", "Redelivered", "#ef4444"],
    ["deliver_no_ack", "Deliver (auto ack)", "#eab308"], ["get", "Get (manual ack)", "#8b5cf6"],
    ["get_no_ack", "Get (auto ack)", "#a855f7"], ["get_empty", "Get (empty)", "#94a3b8"]];
  const rateChart = chartCard({ id: `chart-queue-rates-${vhost}-${name}`.replace(/[^\w-]/g, "_"), title: "Message rates",
    series: RATES.map(([, label, color]) => ({ label, color })),
    format: (v, axis) => (axis ? `${num(v)}/s` : rate(v)) });
  rateChart.el.classList.add("queue-rates");
  const summary = h("div.stats");
  const details = h("div.details");
  const consumers = h("div.table-wrap");
  let deleted = false;

  async function refresh() {
    if (deleted) return;
    // the first load asks for length samples too (RabbitMQ answers *_details.samples)
    const seed = chart.empty();
    let q;
    try {
      q = await api.get(seed ? `${base}?lengths_age=600&lengths_incr=5` : base);
    } catch (e) {
      if (e.status !== 404 || !summary.isConnected) throw e;
      // deleted by someone else meanwhile: say so once instead of failing every refresh
      deleted = true;
      summary.closest(".page").prepend(h("section.card.gone", h("h2", "This queue was deleted"),
        h("p", h("a", { href: "#/queues" }, "All queues"))));
      return;
    }
    if (seed) seedLengths(chart, q, ["messages_ready", "messages_unacknowledged", "messages"]);
    chart.add(Date.now() / 1000, [q.messages_ready ?? 0, q.messages_unacknowledged ?? 0, q.messages ?? 0]);
    const ms = q.message_stats || {};
    rateChart.add(Date.now() / 1000, RATES.map(([k]) => detail(ms, k) ?? 0));
    clear(summary,
      stat("Ready", num(q.messages_ready ?? 0), "queue-ready"), stat("Unacked", num(q.messages_unacknowledged ?? 0), "queue-unacked"),
      stat("Total", num(q.messages ?? 0), "queue-total"), stat("Consumers", num(q.consumers ?? 0), "queue-consumers"),
      stat("Incoming", rate(detail(ms, "publish") ?? 0)), stat("Deliver / get", rate(detail(ms, "deliver_get") ?? 0)),
      stat("Ack", rate(detail(ms, "ack") ?? 0)));
    clear(details, h("dl.props",
      dt("Type"), dd(q.type || q.arguments?.["x-queue-type"] || "classic"),
      q.members && [dt("Leader"), dd(q.leader ?? "?"), dt("Members"), dd(q.members.join(", "))],
      dt("State"), dd(queueState(q)),
      dt("Features"), dd(features(q)),
      dt("Durable"), dd(yesno(q.durable)), dt("Auto delete"), dd(yesno(q.auto_delete)), dt("Exclusive"), dd(yesno(q.exclusive)),
      dt("Arguments"), dd(args(q.arguments)),
      dt("Policy"), dd(q.policy || h("span.muted", "none")),
      dt("Operator policy"), dd(q.operator_policy || h("span.muted", "none")),
      dt("Effective policy definition"), dd(args(q.effective_policy_definition)),
      dt("Message bytes"), dd(bytes(q.message_bytes ?? 0)),
      q.node && [dt("Node"), dd(q.node)]));
    const cs = q.consumer_details || [];
    clear(consumers, h("table.data#queue-consumers-table", h("thead", h("tr", ["Channel", "Consumer tag", "Ack required", "Exclusive", "Prefetch", "Active", "Arguments"].map((x) => h("th", x)))),
      h("tbody", cs.length ? cs.map((c) => h("tr", h("td.mono", c.channel_details?.name ?? ""), h("td.mono", c.consumer_tag),
        h("td", yesno(c.ack_required)), h("td", yesno(c.exclusive)), h("td.num", num(c.prefetch_count ?? 0)),
        h("td", yesno(c.active ?? true)), h("td", args(c.arguments))))
        : h("tr.empty", h("td", { colSpan: 7 }, "No consumers")))));
    await bindings.refresh();
  }

  const bindings = bindingsCard(ctx, { vhost, queue: name });
  let first;
  try {
    first = await api.get(base);
  } catch (e) {
    if (e.status === 404) return { el: notFound("Queue", vhost, name) };
    throw e;
  }
  await refresh().catch((e) => toast(errorText(e), "error"));

  const el = h("div.page",
    h("div.page-head", h("div", h("div.crumb", h("a", { href: "#/queues" }, "Queues"), " · virtual host ", h("span.mono", vhost)), h("h1", "Queue ", h("span.mono#queue-name", name))),
      h("div.head-tags", spanSelect([chart, rateChart]), tags(first.type ? [first.type] : []))),
    summary,
    h("div.grid-2", h("section.card", h("h2", "Details"), details), chart.el),
    rateChart.el,
    h("section.card", h("h2", "Consumers"), consumers),
    bindings.el,
    publishCard(ctx, { vhost, exchange: "", routingKey: name, title: "Publish message",
      hint: "Published to the default exchange with this queue's name as the routing key." }),
    getCard(base),
    h("div.grid-2", purgeCard(base, name, refresh), deleteCard(base, name, () => { deleted = true; location.hash = "#/queues"; })));
  return { el, refresh, mounted: () => { chart.render(); rateChart.render(); }, stop: () => { chart.stop(); rateChart.stop(); } };
}

function stat(label, value, id) {
  return h("div.stat", { id }, h("div.stat-value", value), h("div.stat-label", label));
}
const dt = (t) => h("dt", t);
const dd = (v) => h("dd", v);

export function notFound(kind, vhost, name) {
  return h("div.page", h("section.card", h("h2", `${kind} not found`),
    h("p", `${kind} `, h("code", name), " does not exist in virtual host ", h("code", vhost), ". ",
      h("a", { href: kind === "Queue" ? "#/queues" : "#/exchanges" }, `All ${kind.toLowerCase()}s`))));
}

function getCard(base) {
  const mode = select("ackmode", [
    ["ack_requeue_true", "Nack message requeue true"], ["ack_requeue_false", "Automatic ack"],
    ["reject_requeue_true", "Reject requeue true"], ["reject_requeue_false", "Reject requeue false"],
  ], "ack_requeue_true");
  const encoding = select("encoding", [["auto", "Automatic string/base64"], ["base64", "Base64"]], "auto");
  const count = input("count", { type: "number", min: 1, value: "1" });
  const truncate = input("truncate", { type: "number", min: 1, value: "50000" });
  const out = h("div.messages#get-result");
  const form = formCard("Get messages", [
    h("p.warn", "Getting messages is a destructive action when the ack mode does not requeue."),
    h("div.row", field("Ack mode", mode), field("Encoding", encoding), field("Messages", count), field("Truncate (bytes)", truncate)),
  ], "Get message(s)", async (_form, button) => {
    const body = { count: Number(count.value) || 1, ackmode: mode.value, encoding: encoding.value, truncate: Number(truncate.value) || 50000 };
    const msgs = await act(() => api.post(`${base}/get`, body), null, button);
    if (msgs === undefined) return;
    clear(out, msgs.length ? msgs.map((m, i) => messageView(m, i + 1)) : h("p.empty-note", "Queue is empty"));
  }, { open: true, id: "get-messages" });
  form.append(out);
  return form;
}

function messageView(m, n) {
  const props = { ...(m.properties || {}) };
  const headers = props.headers;
  delete props.headers;
  return h("div.message", h("h3", `Message ${n}`),
    h("dl.props",
      dt("Exchange"), dd(m.exchange === "" ? h("span.muted", "(AMQP default)") : m.exchange),
      dt("Routing key"), dd(h("span.mono", m.routing_key)),
      dt("Redelivered"), dd(yesno(m.redelivered)),
      dt("Properties"), dd(args(props)),
      headers && [dt("Headers"), dd(args(headers))],
      dt("Payload"), dd(h("span.muted", `${num(m.payload_bytes)} bytes, encoding: ${m.payload_encoding}`)),
      m.message_count !== undefined && [dt("Messages left"), dd(num(m.message_count))]),
    h("pre.payload", m.payload));
}

function purgeCard(base, name, refresh) {
  const button = h("button.btn.btn-danger#purge-queue", { type: "button", on: { click: async () => {
    if (!confirmDialog(`Purge all ready messages of ${name}?`)) return;
    const ok = await act(() => api.del(`${base}/contents`), `Queue ${name} purged`, button);
    if (ok !== undefined) await refresh();
  } } }, "Purge messages");
  return h("section.card", h("h2", "Purge"), h("p.muted", "Removes every ready message; unacknowledged messages stay."), button);
}

function deleteCard(base, name, done) {
  const ifEmpty = h("input", { type: "checkbox", name: "if-empty" });
  const ifUnused = h("input", { type: "checkbox", name: "if-unused" });
  const button = h("button.btn.btn-danger#delete-queue", { type: "button", on: { click: async () => {
    if (!confirmDialog(`Delete queue ${name}?`)) return;
    const q = new URLSearchParams();
    if (ifEmpty.checked) q.set("if-empty", "true");
    if (ifUnused.checked) q.set("if-unused", "true");
    const ok = await act(() => api.del(q.size ? `${base}?${q}` : base), `Queue ${name} deleted`, button);
    if (ok !== undefined) done();
  } } }, "Delete queue");
  return h("section.card", h("h2", "Delete"),
    h("div.row", h("label.check", ifEmpty, " Only if empty"), h("label.check", ifUnused, " Only if unused")), button);
}

