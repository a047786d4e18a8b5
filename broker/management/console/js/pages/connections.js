// Connections (with close) and channels.
import * as api from "../api.js";
import { h, clear, num, rate, bytes, detail, act, confirmDialog } from "../util.js";
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

export const connectionHref = (name) => `#/connections/${api.enc(name)}`;

export async function renderConnections(ctx) {
  const table = new PagedTable({
    id: "connections-table",
    url: () => (ctx.vhost ? `/api/vhosts/${api.enc(ctx.vhost)}/connections` : "/api/connections"),
    rowLink: (c) => connectionHref(c.name),
    columns: [
      // as RabbitMQ's console: the peer address, and under it the name the client gave
      { key: "name", label: "Name", render: (c) => h("span", h("a.mono", { href: connectionHref(c.name) }, c.name),
        c.user_provided_name ? h("span.conn-name", c.user_provided_name) : "") },
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
    columns: channelColumns(),
  });
  await table.refresh();
  return { el: h("div.page", h("div.page-head", h("h1", "Channels")), table.el), refresh: () => table.refresh() };
}

function channelColumns() {
  return [
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
  ];
}

// One connection: what it negotiated, its client, its channels, and close.
export async function renderConnection(ctx, name) {
  const base = api.path`/api/connections/${name}`;
  let c;
  try {
    c = await api.get(base);
  } catch (e) {
    if (e.status === 404) {
      return { el: h("div.page", h("section.card", h("h2", "Connection closed"),
        h("p", "Connection ", h("code", name), " is not open any more. ", h("a", { href: "#/connections" }, "All connections")))) };
    }
    throw e;
  }
  const details = h("div.grid-2");
  const channels = new PagedTable({ id: "connection-channels-table", local: true, url: () => `${base}/channels`, columns: channelColumns() });
  let closed = false;

  function render(conn) {
    const cp = conn.client_properties || {};
    const caps = Object.entries(cp.capabilities || {}).filter(([, v]) => v).map(([k]) => k);
    const when = conn.connected_at ? new Date(conn.connected_at).toLocaleString() : "";
    clear(details,
      h("section.card", h("h2", "Connection"), h("dl.props",
        dt("User"), dd(conn.user), dt("Virtual host"), dd(conn.vhost), dt("State"), dd(state(conn.state)),
        dt("Protocol"), dd(conn.protocol), dt("Authentication"), dd(conn.auth_mechanism),
        dt("From"), dd(h("span.mono", `${conn.peer_host}:${conn.peer_port}`)), dt("To"), dd(h("span.mono", `${conn.host}:${conn.port}`)),
        dt("Connected at"), dd(when), dt("TLS"), dd(conn.ssl ? `${conn.ssl_protocol || "yes"} ${conn.ssl_cipher || ""}` : "no"),
        dt("Heartbeat"), dd(conn.timeout !== undefined ? `${conn.timeout} s` : ""),
        dt("Frame max"), dd(conn.frame_max !== undefined ? `${num(conn.frame_max)} bytes` : ""),
        dt("Channel max"), dd(num(conn.channel_max)),
        dt("Received"), dd(`${bytes(conn.recv_oct ?? 0)} (${bytes(detail(conn, "recv_oct") ?? 0)}/s)`),
        dt("Sent"), dd(`${bytes(conn.send_oct ?? 0)} (${bytes(detail(conn, "send_oct") ?? 0)}/s)`))),
      h("section.card", h("h2", "Client"), h("dl.props",
        dt("Product"), dd(client(cp)), dt("Platform"), dd(cp.platform || ""),
        cp.connection_name && [dt("Connection name"), dd(cp.connection_name)],
        dt("Capabilities"), dd(caps.length ? caps.map((k) => h("span.tag", k)) : h("span.muted", "none")),
        cp.information && [dt("Information"), dd(cp.information)])));
  }
  render(c);
  await channels.refresh();

  const reason = h("input", { type: "text", name: "reason", value: "Closed via management console", "aria-label": "Reason" });
  const close = h("button.btn.btn-danger#close-connection", { type: "button", on: { click: async () => {
    if (!confirmDialog(`Close connection ${name}?`)) return;
    const ok = await act(() => api.del(base, { headers: { "X-Reason": reason.value } }), "Connection closed", close);
    if (ok !== undefined) {
      closed = true;
      location.hash = "#/connections";
    }
  } } }, "Force close");

  const el = h("div.page",
    h("div.page-head", h("div", h("div.crumb", h("a", { href: "#/connections" }, "Connections")), h("h1", "Connection ", h("span.mono", name)))),
    details,
    h("section.card", h("h2", "Channels"), channels.el),
    h("section.card", h("h2", "Close this connection"), h("div.row", h("label.inline", "Reason ", reason), close)));
  return {
    el,
    async refresh() {
      if (closed) return;
      try {
        render(await api.get(base));
      } catch (e) {
        if (e.status !== 404) throw e;
        closed = true; // closed meanwhile: say so instead of failing every refresh
        clear(details, h("section.card", h("h2", "Connection closed"), h("p.muted", "This connection is not open any more.")));
        return;
      }
      await channels.refresh();
    },
  };
}

const dt = (t) => h("dt", t);
const dd = (v) => h("dd", v);

