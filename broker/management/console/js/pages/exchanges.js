// Exchanges: the list with an add form, one exchange's page, and the bindings and publish
// cards the queue page shares.
import * as api from "../api.js";
import { h, clear, rate, detail, args, yesno, act, toast, errorText, confirmDialog } from "../util.js";
import { field, input, select, textarea, formCard, keyValueEditor, EXCHANGE_ARGUMENTS } from "../forms.js";
import { PagedTable } from "../table.js";

const DEFAULT = "amq.default";
export const exchangeHref = (vhost, name) => `#/exchanges/${api.enc(vhost)}/${api.enc(name || DEFAULT)}`;
const display = (name) => (name === "" ? h("span.muted", "(AMQP default)") : name);

function features(x) {
  return h("span.features",
    x.durable && h("abbr.feat", { title: "durable" }, "D"),
    x.auto_delete && h("abbr.feat", { title: "auto-delete" }, "AD"),
    x.internal && h("abbr.feat", { title: "internal" }, "I"),
    Object.keys(x.arguments || {}).map((k) => h("abbr.feat.feat-arg", { title: `${k}: ${JSON.stringify(x.arguments[k])}` }, k === "alternate-exchange" ? "AE" : "Args")),
    x.policy && h("span.feat.feat-policy", { title: "policy" }, x.policy));
}

export async function renderList(ctx) {
  const table = new PagedTable({
    id: "exchanges-table",
    url: () => ctx.scoped("exchanges"),
    rowLink: (x) => exchangeHref(x.vhost, x.name),
    columns: [
      { key: "vhost", label: "Virtual host" },
      { key: "name", label: "Name", render: (x) => h("a.strong", { href: exchangeHref(x.vhost, x.name) }, display(x.name)) },
      { key: "type", label: "Type" },
      { key: "features", label: "Features", sort: false, render: features },
      { key: "message_stats.publish_in_details.rate", label: "Rate in", num: true, render: (x) => rate(detail(x.message_stats, "publish_in") ?? 0) },
      { key: "message_stats.publish_out_details.rate", label: "Rate out", num: true, render: (x) => rate(detail(x.message_stats, "publish_out") ?? 0) },
    ],
  });
  await table.refresh();
  return { el: h("div.page", h("div.page-head", h("h1", "Exchanges")), table.el, addExchangeForm(ctx, table)), refresh: () => table.refresh() };
}

function addExchangeForm(ctx, table) {
  const vhosts = ctx.vhosts.length ? ctx.vhosts : ["/"];
  const vhost = select("vhost", vhosts, ctx.vhost || (vhosts.includes("/") ? "/" : vhosts[0]));
  const name = input("name", { required: true, placeholder: "events" });
  const types = (ctx.overview?.exchange_types || []).map((t) => t.name);
  const type = select("type", types.length ? types : ["direct", "fanout", "headers", "topic"], "direct");
  const durable = select("durable", [["true", "Durable"], ["false", "Transient"]], "true");
  const autoDelete = select("auto_delete", [["false", "No"], ["true", "Yes"]], "false");
  const internal = select("internal", [["false", "No"], ["true", "Yes"]], "false");
  const argsEd = keyValueEditor("Arguments", EXCHANGE_ARGUMENTS);
  return formCard("Add a new exchange", [
    field("Virtual host", vhost), field("Name", name), field("Type", type), field("Durability", durable),
    field("Auto delete", autoDelete), field("Internal", internal), field("Arguments", argsEd),
  ], "Add exchange", async (_form, button) => {
    let a;
    try { a = argsEd.value(); } catch (e) { return toast(e.message, "error"); }
    const body = { type: type.value, durable: durable.value === "true", auto_delete: autoDelete.value === "true",
                   internal: internal.value === "true", arguments: a };
    const ok = await act(() => api.put(api.path`/api/exchanges/${vhost.value}/${name.value}`, body), `Exchange ${name.value} added`, button);
    if (ok !== undefined) {
      name.value = "";
      await table.refresh();
    }
  }, { id: "add-exchange" });
}

export async function renderOne(ctx, vhost, name) {
  const base = api.path`/api/exchanges/${vhost}/${name}`;
  const real = name === DEFAULT ? "" : name;
  let x;
  try {
    x = await api.get(base);
  } catch (e) {
    if (e.status === 404) {
      const { notFound } = await import("./queues.js");
      return { el: notFound("Exchange", vhost, name) };
    }
    throw e;
  }
  const details = h("dl.props",
    h("dt", "Type"), h("dd", x.type), h("dt", "Features"), h("dd", features(x)),
    h("dt", "Durable"), h("dd", yesno(x.durable)), h("dt", "Auto delete"), h("dd", yesno(x.auto_delete)),
    h("dt", "Internal"), h("dd", yesno(x.internal)), h("dt", "Arguments"), h("dd", args(x.arguments)),
    h("dt", "Policy"), h("dd", x.policy || h("span.muted", "none")));
  const bindings = bindingsCard(ctx, { vhost, exchange: real });
  await bindings.refresh();
  const builtin = real === "" || real.startsWith("amq.");
  const del = h("button.btn.btn-danger#delete-exchange", { type: "button", disabled: builtin, on: { click: async () => {
    if (!confirmDialog(`Delete exchange ${name}?`)) return;
    const ok = await act(() => api.del(base), `Exchange ${name} deleted`, del);
    if (ok !== undefined) location.hash = "#/exchanges";
  } } }, "Delete exchange");
  const el = h("div.page",
    h("div.page-head", h("div", h("div.crumb", h("a", { href: "#/exchanges" }, "Exchanges"), " · virtual host ", h("span.mono", vhost)),
      h("h1", "Exchange ", h("span.mono", real === "" ? "(AMQP default)" : name)))),
    h("section.card", h("h2", "Details"), details),
    bindings.el,
    publishCard(ctx, { vhost, exchange: real, title: "Publish message" }),
    h("section.card", h("h2", "Delete"), builtin ? h("p.muted", "Built-in exchanges cannot be deleted.") : del));
  let gone = false;
  async function refresh() {
    if (gone) return;
    try {
      await api.get(base);
    } catch (e) {
      if (e.status !== 404) throw e;
      gone = true; // deleted by someone else meanwhile
      el.prepend(h("section.card.gone", h("h2", "This exchange was deleted"), h("p", h("a", { href: "#/exchanges" }, "All exchanges"))));
      return;
    }
    await bindings.refresh();
  }
  return { el, refresh };
}

// Bindings of a queue (to it) or an exchange (from it), with unbind and an add form.
export function bindingsCard(ctx, { vhost, queue, exchange }) {
  const forQueue = queue !== undefined;
  const listUrl = forQueue ? api.path`/api/queues/${vhost}/${queue}/bindings`
    : api.path`/api/exchanges/${vhost}/${exchange === "" ? DEFAULT : exchange}/bindings/source`;
  const body = h("tbody");
  const table = h("table.data#bindings-table", h("thead", h("tr", h("th", forQueue ? "From" : "To"), h("th", "Routing key"), h("th", "Arguments"), h("th", ""))), body);

  async function refresh() {
    const list = await api.get(listUrl);
    clear(body, list.length ? list.map((b) => {
      const label = forQueue
        ? (b.source === "" ? h("span.muted", "(Default exchange binding)") : h("a", { href: exchangeHref(vhost, b.source) }, b.source))
        : h("span", h("span.tag", b.destination_type), " ", b.destination_type === "queue"
          ? h("a", { href: `#/queues/${api.enc(vhost)}/${api.enc(b.destination)}` }, b.destination)
          : h("a", { href: exchangeHref(vhost, b.destination) }, b.destination));
      const unbind = b.source === "" ? null : h("button.btn.btn-small", { type: "button", on: { click: async (ev) => {
        const url = api.path`/api/bindings/${vhost}/e/${b.source}/${b.destination_type === "queue" ? "q" : "e"}/${b.destination}/${b.properties_key}`;
        const ok = await act(() => api.del(url), "Unbound", ev.target);
        if (ok !== undefined) await refresh();
      } } }, "Unbind");
      return h("tr", h("td", label), h("td.mono", b.routing_key), h("td", args(b.arguments)), h("td", unbind));
    }) : h("tr.empty", h("td", { colSpan: 4 }, "No bindings")));
  }

  const kind = select("destination_type", [["q", "Queue"], ["e", "Exchange"]], "q");
  const other = input(forQueue ? "source" : "destination", { required: true, placeholder: forQueue ? "amq.topic" : "a queue" });
  const key = input("routing_key", { placeholder: "#" });
  const argsEd = keyValueEditor("Binding arguments");
  const form = formCard(forQueue ? "Add binding to this queue" : "Add binding from this exchange", [
    forQueue ? null : field("To", kind),
    field(forQueue ? "From exchange" : "Name", other), field("Routing key", key), field("Arguments", argsEd),
  ], "Bind", async (_form, button) => {
    let a;
    try { a = argsEd.value(); } catch (e) { return toast(e.message, "error"); }
    const url = forQueue ? api.path`/api/bindings/${vhost}/e/${other.value}/q/${queue}`
      : `${api.path`/api/bindings/${vhost}/e/${exchange}`}/${kind.value}/${api.enc(other.value)}`;
    const ok = await act(() => api.post(url, { routing_key: key.value, arguments: a }), "Binding added", button);
    if (ok !== undefined) {
      key.value = "";
      await refresh();
    }
  }, { id: "add-binding" });

  return { el: h("section.card#bindings", h("h2", "Bindings"), h("div.table-wrap", table), form), refresh };
}

// Publish through the API: to an exchange with a routing key (fixed when the queue page passes one).
export function publishCard(ctx, { vhost, exchange, routingKey, title, hint }) {
  const key = input("routing_key", { value: routingKey ?? "", readOnly: routingKey !== undefined });
  const mode = select("delivery_mode", [["1", "1 - Non-persistent"], ["2", "2 - Persistent"]], "2");
  const headers = keyValueEditor("Headers");
  const props = keyValueEditor("Properties", [["content_type", "string"], ["correlation_id", "string"], ["reply_to", "string"],
    ["expiration", "string"], ["message_id", "string"], ["type", "string"], ["user_id", "string"], ["app_id", "string"], ["priority", "number"]]);
  const payload = textarea("payload", { rows: 5, placeholder: "Message body" });
  const encoding = select("payload_encoding", [["string", "String"], ["base64", "Base64"]], "string");
  const card = formCard(title, [
    hint ? h("p.muted", hint) : null,
    field("Routing key", key), field("Delivery mode", mode), field("Headers", headers), field("Properties", props),
    field("Payload", payload), field("Payload encoding", encoding),
  ], "Publish message", async (_form, button) => {
    let properties;
    try {
      properties = { ...props.value(), delivery_mode: Number(mode.value) };
      const hd = headers.value();
      if (Object.keys(hd).length) properties.headers = hd;
    } catch (e) { return toast(e.message, "error"); }
    const url = api.path`/api/exchanges/${vhost}/${exchange === "" ? DEFAULT : exchange}/publish`;
    button.disabled = true;
    try {
      const res = await api.post(url, { properties, routing_key: key.value, payload: payload.value, payload_encoding: encoding.value });
      if (res && res.routed === false) toast("Message published, but not routed", "warn");
      else toast("Message published");
    } catch (e) { toast(errorText(e), "error"); } finally { button.disabled = false; }
  }, { id: "publish-message" });
  return card;
}
