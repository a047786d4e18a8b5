// Admin: users (tags, password, permissions, topic permissions), virtual hosts, policies and
// operator policies.
import * as api from "../api.js";
import { h, clear, num, rate, detail, args, tags, act, toast, confirmDialog } from "../util.js";
import { field, input, select, formCard, keyValueEditor, POLICY_KEYS } from "../forms.js";
import { PagedTable } from "../table.js";

const TAGS = ["administrator", "monitoring", "policymaker", "management", "impersonator"];
const OPERATOR_KEYS = [["message-ttl", "number"], ["expires", "number"], ["max-length", "number"],
  ["max-length-bytes", "number"], ["delivery-limit", "number"]];

function subnav(ctx, active) {
  const items = [["users", "Users", "#/users", "administrator"], ["vhosts", "Virtual hosts", "#/vhosts", "administrator"],
    ["policies", "Policies", "#/policies", "policymaker"], ["limits", "Limits", "#/limits", "administrator"]];
  return h("nav.subnav", items.filter(([, , , tag]) => ctx.can(tag)).map(([id, label, href]) =>
    h("a", { href, class: id === active ? "active" : "" }, label)));
}

function page(ctx, active, title, ...children) {
  return h("div.page.admin", subnav(ctx, active), h("div.page-head", h("h1", title)), children);
}

function tagInput(initial = "") {
  const el = input("tags", { value: initial, placeholder: "administrator, monitoring" });
  const quick = h("div.shortcuts", h("span.muted", "Set: "), [...TAGS, ""].map((t) =>
    h("button.link", { type: "button", on: { click: () => {
      if (!t) { el.value = ""; return; }
      const cur = el.value.split(",").map((x) => x.trim()).filter(Boolean);
      if (!cur.includes(t)) cur.push(t);
      el.value = cur.join(", ");
    } } }, t || "none")));
  return { el, field: field("Tags", h("div", el, quick)), value: () => el.value.split(",").map((x) => x.trim()).filter(Boolean).join(",") };
}

export async function renderUsers(ctx) {
  if (!ctx.isAdmin()) return renderPolicies(ctx);
  let perms = [];
  const table = new PagedTable({
    id: "users-table",
    local: true,
    url: () => "/api/users",
    rowLink: (u) => `#/users/${api.enc(u.name)}`,
    columns: [
      { key: "name", label: "Name", render: (u) => h("a.strong", { href: `#/users/${api.enc(u.name)}` }, u.name) },
      { key: "tags", label: "Tags", render: (u) => tags(u.tags) },
      { key: "vhosts", label: "Can access virtual hosts", sort: false, render: (u) => {
        const vs = perms.filter((p) => p.user === u.name).map((p) => p.vhost);
        return vs.length ? vs.join(", ") : h("span.muted", "no access");
      } },
      { key: "password_hash", label: "Has password", sort: false, render: (u) => (u.password_hash ? "●" : h("span.muted", "○")) },
    ],
  });
  const refresh = async () => {
    perms = await api.get("/api/permissions").catch(() => []);
    await table.refresh();
  };
  await refresh();

  const name = input("username", { required: true, autocomplete: "off" });
  const pass = input("password", { type: "password", autocomplete: "new-password" });
  const pass2 = input("password_confirm", { type: "password", autocomplete: "new-password" });
  const t = tagInput();
  const add = formCard("Add a user", [field("Username", name), field("Password", pass), field("Password (again)", pass2), t.field],
    "Add user", async (_f, button) => {
      if (pass.value !== pass2.value) return toast("The passwords do not match", "error");
      const body = { tags: t.value() };
      if (pass.value) body.password = pass.value;
      else body.password_hash = "";
      const ok = await act(() => api.put(api.path`/api/users/${name.value}`, body), `User ${name.value} added`, button);
      if (ok !== undefined) {
        name.value = pass.value = pass2.value = t.el.value = "";
        await refresh();
      }
    }, { id: "add-user" });
  return { el: page(ctx, "users", "Users", table.el, add), refresh };
}

export async function renderUser(ctx, name) {
  const base = api.path`/api/users/${name}`;
  let user;
  try {
    user = await api.get(base);
  } catch (e) {
    if (e.status === 404) return { el: page(ctx, "users", "User not found", h("section.card", h("p", "No user ", h("code", name), ". ", h("a", { href: "#/users" }, "All users")))) };
    throw e;
  }
  const permBody = h("tbody");
  const topicBody = h("tbody");

  async function refresh() {
    const [perms, topics] = await Promise.all([api.get(`${base}/permissions`), api.get(`${base}/topic-permissions`).catch(() => [])]);
    clear(permBody, perms.length ? perms.map((p) => h("tr", h("td", p.vhost), h("td.mono", p.configure), h("td.mono", p.write), h("td.mono", p.read),
      h("td", h("button.btn.btn-small", { type: "button", on: { click: async (ev) => {
        const ok = await act(() => api.del(api.path`/api/permissions/${p.vhost}/${name}`), "Permission cleared", ev.target);
        if (ok !== undefined) await refresh();
      } } }, "Clear")))) : h("tr.empty", h("td", { colSpan: 5 }, "No permissions")));
    clear(topicBody, topics.length ? topics.map((p) => h("tr", h("td", p.vhost), h("td", p.exchange), h("td.mono", p.write), h("td.mono", p.read),
      h("td", h("button.btn.btn-small", { type: "button", on: { click: async (ev) => {
        const ok = await act(() => api.del(api.path`/api/topic-permissions/${p.vhost}/${name}`), "Topic permission cleared", ev.target);
        if (ok !== undefined) await refresh();
      } } }, "Clear")))) : h("tr.empty", h("td", { colSpan: 5 }, "No topic permissions")));
  }
  await refresh();

  const vhosts = ctx.vhosts.length ? ctx.vhosts : ["/"];
  const pv = select("vhost", vhosts, vhosts.includes("/") ? "/" : vhosts[0]);
  const conf = input("configure", { value: ".*" }), write = input("write", { value: ".*" }), read = input("read", { value: ".*" });
  const setPerm = formCard("Set permission", [h("div.row", field("Virtual host", pv), field("Configure regexp", conf), field("Write regexp", write), field("Read regexp", read))],
    "Set permission", async (_f, button) => {
      const ok = await act(() => api.put(api.path`/api/permissions/${pv.value}/${name}`, { configure: conf.value, write: write.value, read: read.value }),
        "Permission set", button);
      if (ok !== undefined) await refresh();
    }, { open: true, id: "set-permission" });

  const tv = select("vhost", vhosts, pv.value);
  const tex = input("exchange", { value: "amq.topic" }), tw = input("write", { value: ".*" }), tr = input("read", { value: ".*" });
  const setTopic = formCard("Set topic permission", [h("div.row", field("Virtual host", tv), field("Exchange", tex), field("Write regexp", tw), field("Read regexp", tr))],
    "Set topic permission", async (_f, button) => {
      const ok = await act(() => api.put(api.path`/api/topic-permissions/${tv.value}/${name}`, { exchange: tex.value, write: tw.value, read: tr.value }),
        "Topic permission set", button);
      if (ok !== undefined) await refresh();
    }, { id: "set-topic-permission" });

  const t = tagInput(Array.isArray(user.tags) ? user.tags.join(", ") : user.tags || "");
  const pass = input("password", { type: "password", autocomplete: "new-password", placeholder: "unchanged" });
  const update = formCard("Update this user", [t.field, field("New password", pass, "Leave empty to keep the current password.")],
    "Update user", async (_f, button) => {
      // The API replaces the whole user: resend the current hash to keep the password.
      const body = { tags: t.value() };
      if (pass.value) body.password = pass.value;
      else {
        body.password_hash = user.password_hash ?? "";
        if (user.hashing_algorithm) body.hashing_algorithm = user.hashing_algorithm;
      }
      const ok = await act(() => api.put(base, body), `User ${name} updated`, button);
      if (ok !== undefined) {
        pass.value = "";
        user = await api.get(base);
      }
    }, { id: "update-user" });

  const del = h("button.btn.btn-danger#delete-user", { type: "button", on: { click: async () => {
    if (!confirmDialog(`Delete user ${name}?`)) return;
    const ok = await act(() => api.del(base), `User ${name} deleted`, del);
    if (ok !== undefined) location.hash = "#/users";
  } } }, "Delete user");

  const el = page(ctx, "users", h("span", "User ", h("span.mono", name)),
    h("section.card", h("h2", "Overview"), h("dl.props", h("dt", "Tags"), h("dd", tags(user.tags).length ? tags(user.tags) : h("span.muted", "none")),
      h("dt", "Password"), h("dd", user.password_hash ? "set" : h("span.muted", "none")),
      user.hashing_algorithm && [h("dt", "Hashing"), h("dd.mono", user.hashing_algorithm)])),
    h("section.card", h("h2", "Permissions"), h("table.data#permissions-table", h("thead", h("tr", ["Virtual host", "Configure", "Write", "Read", ""].map((x) => h("th", x)))), permBody), setPerm),
    h("section.card", h("h2", "Topic permissions"), h("table.data#topic-permissions-table", h("thead", h("tr", ["Virtual host", "Exchange", "Write", "Read", ""].map((x) => h("th", x)))), topicBody), setTopic),
    update,
    h("section.card", h("h2", "Delete"), del));
  return { el, refresh };
}

export async function renderVhosts(ctx) {
  if (!ctx.isAdmin()) return renderPolicies(ctx);
  const table = new PagedTable({
    id: "vhosts-table",
    url: () => "/api/vhosts",
    columns: [
      { key: "name", label: "Name", render: (v) => h("span.strong", v.name) },
      { key: "description", label: "Description" },
      { key: "tags", label: "Tags", render: (v) => tags(v.tags) },
      { key: "default_queue_type", label: "Default queue type", render: (v) => (v.default_queue_type && v.default_queue_type !== "undefined" ? v.default_queue_type : "classic") },
      { key: "messages_ready", label: "Ready", num: true, render: (v) => num(v.messages_ready ?? 0) },
      { key: "messages_unacknowledged", label: "Unacked", num: true, render: (v) => num(v.messages_unacknowledged ?? 0) },
      { key: "messages", label: "Total", num: true, render: (v) => num(v.messages ?? 0) },
      { key: "message_stats.publish_details.rate", label: "Publish", num: true, render: (v) => rate(detail(v.message_stats, "publish") ?? 0) },
      { key: "delete", label: "", sort: false, render: (v) => h("button.btn.btn-small.btn-danger", { type: "button", on: { click: async (ev) => {
        if (!confirmDialog(`Delete virtual host ${v.name} and everything in it?`)) return;
        const ok = await act(() => api.del(api.path`/api/vhosts/${v.name}`), `Virtual host ${v.name} deleted`, ev.target);
        if (ok !== undefined) { await ctx.reloadHeader(); await table.refresh(); }
      } } }, "Delete") },
    ],
  });
  await table.refresh();
  const name = input("name", { required: true });
  const desc = input("description");
  const vtags = input("tags", { placeholder: "production, eu" });
  const dqt = select("default_queue_type", [["classic", "Classic"], ["quorum", "Quorum"], ["stream", "Stream"]], "classic");
  const add = formCard("Add a virtual host", [field("Name", name), field("Description", desc), field("Tags", vtags), field("Default queue type", dqt)],
    "Add virtual host", async (_f, button) => {
      const body = { description: desc.value, tags: vtags.value, default_queue_type: dqt.value };
      const ok = await act(() => api.put(api.path`/api/vhosts/${name.value}`, body), `Virtual host ${name.value} added`, button);
      if (ok !== undefined) {
        name.value = desc.value = vtags.value = "";
        await ctx.reloadHeader();
        await table.refresh();
      }
    }, { id: "add-vhost" });
  return { el: page(ctx, "vhosts", "Virtual hosts", table.el, add), refresh: () => table.refresh() };
}

function policyTable(ctx, kind, onEdit) {
  const table = new PagedTable({
    id: `${kind}-table`,
    local: true,
    url: () => ctx.scoped(kind),
    columns: [
      { key: "vhost", label: "Virtual host" },
      { key: "name", label: "Name", render: (p) => h("span.strong", p.name) },
      { key: "pattern", label: "Pattern", render: (p) => h("span.mono", p.pattern) },
      { key: "apply-to", label: "Apply to" },
      { key: "definition", label: "Definition", sort: false, render: (p) => args(p.definition) },
      { key: "priority", label: "Priority", num: true },
      { key: "actions", label: "", sort: false, render: (p) => h("span.row-actions",
        h("button.btn.btn-small", { type: "button", on: { click: () => onEdit(p) } }, "Edit"),
        h("button.btn.btn-small.btn-danger", { type: "button", on: { click: async (ev) => {
          if (!confirmDialog(`Delete ${kind === "policies" ? "policy" : "operator policy"} ${p.name}?`)) return;
          const ok = await act(() => api.del(api.path`/api/${kind}/${p.vhost}/${p.name}`), `Deleted ${p.name}`, ev.target);
          if (ok !== undefined) await table.refresh();
        } } }, "Delete")) },
    ],
  });
  return table;
}

function policyForm(ctx, kind, table) {
  const slot = h("div");
  const vhosts = ctx.vhosts.length ? ctx.vhosts : ["/"];
  const operator = kind === "operator-policies";
  function build(p = {}) {
    const vhost = select("vhost", vhosts, p.vhost || ctx.vhost || (vhosts.includes("/") ? "/" : vhosts[0]));
    const name = input("name", { required: true, value: p.name || "" });
    const pattern = input("pattern", { required: true, value: p.pattern ?? "", placeholder: "^amq\\." });
    const applyTo = select("apply-to", operator ? [["queues", "Queues"]] : [["all", "Exchanges and queues"], ["exchanges", "Exchanges"], ["queues", "Queues"], ["classic_queues", "Classic queues"], ["quorum_queues", "Quorum queues"]], p["apply-to"] || (operator ? "queues" : "all"));
    const priority = input("priority", { type: "number", value: String(p.priority ?? 0) });
    const def = keyValueEditor("Definition", operator ? OPERATOR_KEYS : POLICY_KEYS, p.definition || {});
    const card = formCard(p.name ? `Update ${operator ? "operator policy" : "policy"} ${p.name}` : `Add / update ${operator ? "an operator policy" : "a policy"}`,
      [field("Virtual host", vhost), field("Name", name), field("Pattern", pattern), field("Apply to", applyTo), field("Priority", priority), field("Definition", def)],
      operator ? "Add / update operator policy" : "Add / update policy", async (_f, button) => {
        let definition;
        try { definition = def.value(); } catch (e) { return toast(e.message, "error"); }
        const body = { pattern: pattern.value, definition, priority: Number(priority.value) || 0, "apply-to": applyTo.value };
        const ok = await act(() => api.put(api.path`/api/${kind}/${vhost.value}/${name.value}`, body), `${name.value} saved`, button);
        if (ok !== undefined) {
          await table.refresh();
          build();
        }
      }, { open: Boolean(p.name), id: operator ? "add-operator-policy" : "add-policy" });
    clear(slot, card);
    if (p.name) card.scrollIntoView({ behavior: "smooth", block: "start" });
  }
  build();
  return { el: slot, edit: build };
}

export async function renderPolicies(ctx) {
  let form, opForm;
  const table = policyTable(ctx, "policies", (p) => form.edit(p));
  form = policyForm(ctx, "policies", table);
  const children = [h("h2.section-title", "User policies"), table.el, form.el];
  let opTable = null;
  if (ctx.isAdmin()) {
    opTable = policyTable(ctx, "operator-policies", (p) => opForm.edit(p));
    opForm = policyForm(ctx, "operator-policies", opTable);
    children.push(h("h2.section-title", "Operator policies"), h("p.muted", "Operator policies cap what user policies and queue arguments set (the lower value wins)."), opTable.el, opForm.el);
  }
  const refresh = async () => { await table.refresh(); if (opTable) await opTable.refresh(); };
  await refresh();
  return { el: page(ctx, "policies", "Policies", children), refresh };
}

// Limits: per-vhost max-connections / max-queues and per-user max-connections / max-channels
// (RabbitMQ's /api/vhost-limits and /api/user-limits). A negative value means no limit.
function limitsSection(ctx, { kind, owner, names, choices, refreshAll }) {
  const body = h("tbody");
  const table = h(`table.data#${kind}-table`, h("thead", h("tr", h("th", owner === "vhost" ? "Virtual host" : "User"),
    names.map((n) => h("th.num", n)), h("th", ""))), body);
  async function refresh() {
    const list = await api.get(`/api/${kind}`);
    clear(body, list.length ? list.map((row) => h("tr", h("td", row[owner]),
      names.map((n) => h("td.num", row.value?.[n] === undefined ? h("span.muted", "–") : num(row.value[n]))),
      h("td", h("span.row-actions", Object.keys(row.value || {}).map((n) => h("button.btn.btn-small", { type: "button", on: { click: async (ev) => {
        const ok = await act(() => api.del(api.path`/api/${kind}/${row[owner]}/${n}`), `${n} cleared`, ev.target);
        if (ok !== undefined) await refreshAll();
      } } }, `Clear ${n}`)))))) : h("tr.empty", h("td", { colSpan: names.length + 2 }, "No limits")));
  }
  const who = select(owner, choices, choices[0]);
  const which = select("limit", names, names[0]);
  const value = input("value", { type: "number", value: "100" });
  const form = formCard(owner === "vhost" ? "Set a virtual host limit" : "Set a user limit",
    [h("div.row", field(owner === "vhost" ? "Virtual host" : "User", who), field("Limit", which), field("Value", value, "A negative value removes the limit."))],
    "Set limit", async (_f, button) => {
      const n = Number(value.value);
      if (!Number.isInteger(n)) return toast("The value must be a whole number", "error");
      const ok = await act(() => api.put(api.path`/api/${kind}/${who.value}/${which.value}`, { value: n }), `${which.value} set`, button);
      if (ok !== undefined) await refreshAll();
    }, { id: `set-${kind}` });
  return { el: h("section.card", h("h2", owner === "vhost" ? "Virtual host limits" : "User limits"), h("div.table-wrap", table), form), refresh };
}

export async function renderLimits(ctx) {
  if (!ctx.isAdmin()) return renderPolicies(ctx);
  const all = await api.get("/api/users");
  const users = (Array.isArray(all) ? all : all.items).map((u) => u.name).sort();
  let vh, us;
  const refreshAll = async () => { await vh.refresh(); await us.refresh(); };
  vh = limitsSection(ctx, { kind: "vhost-limits", owner: "vhost", names: ["max-connections", "max-queues"],
    choices: ctx.vhosts.length ? ctx.vhosts : ["/"], refreshAll });
  us = limitsSection(ctx, { kind: "user-limits", owner: "user", names: ["max-connections", "max-channels"],
    choices: users.length ? users : ["guest"], refreshAll });
  await refreshAll();
  return { el: page(ctx, "limits", "Limits", vh.el, us.el), refresh: refreshAll };
}
