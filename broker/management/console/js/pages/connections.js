// Connections (with close) and channels.
import * as api from "../api.js";
import { h, rate, bytes, detail, act, confirmDialog } from "../util.js";
import { PagedTable } from "../table.js";

function state(s) {
  const cls = s === "running" ? "pill-on" : s === "blocked" || s === "blocking" || s === "flow" ? "pill-warn" : "";
  return h(`span.pill${cls ? "." + cls : ""}`, s || "unknown");
}

function client(props) {
  const p = props || {};
  const name = [p.product, p.version].filter(Boolean).join(" ");
  return name || h("span.muted", "unknown");
}

export async function renderConnections(ctx) {
  const table = new PagedTable({
    id: "connections-table",
    url: () => (ctx.vhost ? `/api/vhosts/${api.enc(ctx.vhost)}/connections` : "/api/connections"),
    columns: [
      { key: "name", label: "Name", render: (c) => h("span.mono", c.name) },
      { key: "vhost", label: "Virtual host" },
      { key: "user", label: "User" },
      { key: "state", label: "State", render: (c) => state(c.state) },
      { key: "protocol", label: "Protocol" },
      { key: "client_properties", label: "Client", sort: false, render: (c) => client(c.client_properties) },
      { key: "channels", label: "Channels", num: true },
      { key: "recv_oct_details.rate", label: "From client", num: true, render: (c) => `${bytes(detail(c, "recv_oct") ?? 0)}/s` },
      { key: "send_oct_details.rate", label: "To client", num: true, render: (c) => `${bytes(detail(c, "send_oct") ?? 0)}/s` },
      { key: "close", label: "", sort: false, render: (c) => h("button.btn.btn-small.btn-danger", { type: "button", on: { click: (ev) => {
          if (!confirmDialog(`Close connection ${c.name}?`)) return;
          act(() => api.del(api.path`/api/connections/${c.name}`, { headers: { "X-Reason": "Closed via management console" } }),
            "Connection closed", ev.target).then(() => table.refresh());
        } } }, "Close") },
    ],
  });
  await table.refresh();
  return { el: h("div.page", h("div.page-head", h("h1", "Connections")), table.el), refresh: () => table.refresh() };
}

export async function renderChannels(ctx) {
  const table = new PagedTable({
    id: "channels-table",
    url: () => (ctx.vhost ? `/api/vhosts/${api.enc(ctx.vhost)}/channels` : "/api/channels"),
    columns: [
      { key: "name", label: "Channel", render: (c) => h("span.mono", c.name) },
      { key: "vhost", label: "Virtual host" },
      { key: "user", label: "User" },
      { key: "state", label: "State", render: (c) => state(c.state) },
      { key: "confirm", label: "Mode", render: (c) => [c.confirm && h("span.tag", "confirm"), c.transactional && h("span.tag", "tx")] },
      { key: "prefetch_count", label: "Prefetch", num: true },
      { key: "consumer_count", label: "Consumers", num: true },
      { key: "messages_unacknowledged", label: "Unacked", num: true },
      { key: "message_stats.publish_details.rate", label: "Publish", num: true, render: (c) => rate(detail(c.message_stats, "publish") ?? 0) },
      { key: "message_stats.deliver_get_details.rate", label: "Deliver", num: true, render: (c) => rate(detail(c.message_stats, "deliver_get") ?? 0) },
      { key: "message_stats.ack_details.rate", label: "Ack", num: true, render: (c) => rate(detail(c.message_stats, "ack") ?? 0) },
    ],
  });
  await table.refresh();
  return { el: h("div.page", h("div.page-head", h("h1", "Channels")), table.el), refresh: () => table.refresh() };
}

