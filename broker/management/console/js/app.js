// The console shell: login, header and navigation, hash routing and the refresh timer.
import * as api from "./api.js";
import * as oidc from "./oidc.js";
import { h, clear, toast, errorText } from "./util.js";
import { field, input } from "./forms.js";
import * as overview from "./pages/overview.js";
import * as connections from "./pages/connections.js";
import * as exchanges from "./pages/exchanges.js";
import * as queues from "./pages/queues.js";
import * as admin from "./pages/admin.js";

const REFRESH_KEY = "triomq.refresh";
const VHOST_KEY = "triomq.vhost";

// [pattern, tab, render]; render(ctx, ...params) -> {el, refresh?, stop?}
const ROUTES = [
  [/^\/?$/, "overview", overview.render],
  [/^\/connections$/, "connections", connections.renderConnections],
  [/^\/connections\/([^/]+)$/, "connections", connections.renderConnection],
  [/^\/channels$/, "channels", connections.renderChannels],
  [/^\/exchanges$/, "exchanges", exchanges.renderList],
  [/^\/exchanges\/([^/]+)\/([^/]*)$/, "exchanges", exchanges.renderOne],
  [/^\/queues$/, "queues", queues.renderList],
  [/^\/queues\/([^/]+)\/([^/]+)$/, "queues", queues.renderOne],
  [/^\/users$/, "admin", admin.renderUsers],
  [/^\/users\/([^/]+)$/, "admin", admin.renderUser],
  [/^\/vhosts$/, "admin", admin.renderVhosts],
  [/^\/policies$/, "admin", admin.renderPolicies],
  [/^\/limits$/, "admin", admin.renderLimits],
];

const TABS = [
  ["overview", "Overview", "#/"],
  ["connections", "Connections", "#/connections"],
  ["channels", "Channels", "#/channels"],
  ["exchanges", "Exchanges", "#/exchanges"],
  ["queues", "Queues", "#/queues"],
  ["admin", "Admin", "#/users"],
];

const ctx = {
  user: null, // {name, tags}
  overview: null,
  vhosts: [],
  get vhost() { return sessionStorage.getItem(VHOST_KEY) || ""; },
  isAdmin() { return this.user?.tags.includes("administrator"); },
  can(tag) { return this.isAdmin() || this.user?.tags.includes(tag); },
  // A list endpoint limited to the selected vhost, as RabbitMQ's UI does.
  scoped(kind) { return this.vhost ? `/api/${kind}/${api.enc(this.vhost)}` : `/api/${kind}`; },
};

let shell = null; // {main}: the signed-in layout, null while the login page shows
let current = null; // the page on screen
let navigation = 0; // bumped by every route and logout: a slower page load that lost the race is dropped
let timer = null;
const root = document.getElementById("app");

function normaliseTags(tags) {
  if (Array.isArray(tags)) return tags;
  return String(tags || "").split(",").map((t) => t.trim()).filter(Boolean);
}

const MANAGEMENT_TAGS = ["administrator", "monitoring", "policymaker", "management"];
const NOT_MANAGEMENT = "Not a management user: this user has no management, policymaker, monitoring or administrator tag.";

// How to log in (/api/auth: OAuth 2 or not), asked once per page load.
let authInfo = null;
async function authSettings() {
  if (!authInfo) {
    try {
      authInfo = await api.get("/api/auth", { token: "" });
    } catch {
      authInfo = { oauth_enabled: false }; // a broker without the endpoint: basic login only
    }
  }
  return authInfo;
}

// The management tags of a whoami answer, or an Error saying the user is not a management user.
function managementTags(me) {
  const tags = normaliseTags(me.tags);
  if (!tags.some((t) => MANAGEMENT_TAGS.includes(t))) throw new Error(NOT_MANAGEMENT);
  return tags;
}

// The provider sent the browser back: trade the code, check the token with whoami, keep it.
async function oauthCallback() {
  try {
    const { accessToken } = await oidc.completeLogin(); // the address bar has its hash back
    let me;
    try {
      me = await api.get("/api/whoami", { token: accessToken, scheme: "Bearer" });
    } catch (e) {
      if (e.status === 401 && /not management user/i.test(e.reason || "")) throw new Error(NOT_MANAGEMENT);
      throw e.status === 401 ? new Error("The broker refused the identity provider's token.") : e;
    }
    managementTags(me);
    api.saveBearer(me.name, accessToken);
    await start();
  } catch (e) {
    showLogin(errorText(e));
  }
}

// Login: whoami with the typed credentials decides; nothing is stored unless it answers 200.
function showLogin(message) {
  stopTimer();
  if (current?.stop) current.stop();
  current = null;
  const user = input("username", { autocomplete: "username", required: true, autofocus: true });
  const pass = input("password", { type: "password", autocomplete: "current-password" });
  const error = h("div.login-error", { role: "alert" }, message || "");
  const button = h("button.btn.btn-primary.btn-wide", { type: "submit" }, "Log in");
  const form = h("form.login-card", { on: { submit: async (ev) => {
    ev.preventDefault();
    button.disabled = true;
    clear(error);
    const token = api.basicToken(user.value, pass.value);
    try {
      const me = await api.get("/api/whoami", { token });
      const tags = normaliseTags(me.tags);
      if (!tags.some((t) => MANAGEMENT_TAGS.includes(t))) {
        clear(error, NOT_MANAGEMENT);
        return;
      }
      api.saveCredentials(user.value, pass.value);
      await start();
    } catch (e) {
      // RabbitMQ and TrioMQ answer 401 both for bad credentials ("Login failed") and for a user
      // without a management tag ("Not management user")
      if (e.status === 401 && /not management user/i.test(e.reason || "")) clear(error, NOT_MANAGEMENT);
      else clear(error, e.status === 401 ? "Login failed: wrong user name or password." : errorText(e));
    } finally {
      button.disabled = false;
    }
  } } },
  h("div.login-brand", h("img", { src: "img/logo.svg", alt: "" }), h("span", "TrioMQ")),
  h("p.muted", "Sign in with a broker user."),
  field("Username", user), field("Password", pass), error, button);
  clear(root, h("div.login-page", form));
  user.focus();
  authSettings().then((auth) => {
    if (!auth.oauth_enabled || !form.isConnected || form.querySelector("#oauth-login")) return;
    const sso = h("button.btn.btn-primary.btn-wide#oauth-login", { type: "button", on: { click: async () => {
      sso.disabled = true;
      clear(error);
      try {
        await oidc.beginLogin(auth);
      } catch (e) {
        clear(error, errorText(e));
        sso.disabled = false;
      }
    } } }, "Click here to log in");
    // as RabbitMQ's UI with OAuth 2: the provider's login first; broker users still can below
    form.querySelector("p.muted").replaceWith(
      h("p.muted", "Sign in with your identity provider (OAuth 2)."), sso,
      h("p.muted", "Or with a broker user:"));
  });
}

function header() {
  const refreshSel = h("select#refresh-interval", { "aria-label": "Refresh interval", on: { change: () => {
    sessionStorage.setItem(REFRESH_KEY, refreshSel.value);
    startTimer();
  } } }, [["2", "every 2 s"], ["5", "every 5 s"], ["10", "every 10 s"], ["30", "every 30 s"], ["0", "off"]].map(([v, l]) =>
    h("option", { value: v, selected: v === (sessionStorage.getItem(REFRESH_KEY) || "5") }, `Refresh ${l}`)));
  const vhostSel = h("select#vhost-select", { "aria-label": "Virtual host", on: { change: () => {
    sessionStorage.setItem(VHOST_KEY, vhostSel.value);
    route();
  } } }, h("option", { value: "" }, "All virtual hosts"),
  ctx.vhosts.map((v) => h("option", { value: v, selected: v === ctx.vhost }, v)));
  const ov = ctx.overview || {};
  const product = `${ov.product_name || "TrioMQ"} ${ov.product_version || ov.management_version || ""}`.trim();
  // as RabbitMQ's header: the version (and the RabbitMQ version it answers as) and the cluster
  const compat = ov.rabbitmq_version && ov.product_name !== "RabbitMQ" ? ` (RabbitMQ ${ov.rabbitmq_version})` : "";
  return h("header.top",
    h("div.brand", h("img", { src: "img/logo.svg", alt: "" }), h("span.brand-name", "TrioMQ"),
      h("span.brand-meta", h("span#product-version", product + compat),
        ov.cluster_name ? h("span", "Cluster ", h("b#cluster-name", ov.cluster_name)) : "")),
    h("nav.tabs", TABS.filter(([id]) => id !== "admin" || ctx.can("policymaker")).map(([id, label, href]) =>
      // a policymaker's Admin is the Policies page
      h("a.tab", { href: id === "admin" && !ctx.isAdmin() ? "#/policies" : href, dataset: { tab: id } }, label))),
    h("div.top-right", vhostSel, refreshSel,
      h("span.whoami", h("span.user-icon", "●"), " ", h("b#whoami", ctx.user.name), " ",
        ctx.user.tags.map((t) => h("span.tag.tag-dark", t))),
      h("button.btn.btn-ghost#logout", { type: "button", on: { click: logout } }, "Log out")));
}

function logout() {
  navigation++;
  shell = null;
  api.forgetCredentials();
  sessionStorage.removeItem(VHOST_KEY);
  showLogin("You have logged out.");
}

async function loadContext() {
  const [me, ov, vhosts] = await Promise.all([
    api.get("/api/whoami"), api.get("/api/overview"), api.get("/api/vhosts").catch(() => []),
  ]);
  ctx.user = { name: me.name, tags: normaliseTags(me.tags) };
  ctx.overview = ov;
  const list = Array.isArray(vhosts) ? vhosts : vhosts.items || [];
  ctx.vhosts = list.map((v) => v.name).sort();
  if (ctx.vhost && !ctx.vhosts.includes(ctx.vhost)) sessionStorage.removeItem(VHOST_KEY);
}

async function start() {
  try {
    await loadContext();
  } catch (e) {
    if (e.status === 401) return showLogin("Your session ended: please log in again.");
    return clear(root, h("div.fatal", "The management API did not answer: ", errorText(e)));
  }
  shell = { main: h("main.content") };
  clear(root, header(), shell.main, h("footer.foot", "TrioMQ management console · data from the HTTP API at ", h("code", "/api")));
  route();
}

// Rebuilds the header's vhost list after vhosts change.
ctx.reloadHeader = async () => {
  await loadContext();
  if (shell) root.querySelector("header.top")?.replaceWith(header());
  markTab();
};

function markTab() {
  for (const a of root.querySelectorAll(".tabs .tab")) a.classList.toggle("active", a.dataset.tab === ctx.tab);
}

async function route() {
  if (oidc.isCallback()) return oauthCallback();
  if (!api.credentials()) return showLogin();
  if (!shell) return start();
  const nav = ++navigation;
  const hash = location.hash.replace(/^#/, "") || "/";
  if (current?.stop) current.stop();
  current = null;
  for (const [re, tab, render] of ROUTES) {
    const m = hash.match(re);
    if (!m) continue;
    ctx.tab = tab;
    markTab();
    let page;
    try {
      const params = m.slice(1).map((p) => decodeURIComponent(p)); // throws on a malformed %-escape
      page = await render(ctx, ...params);
    } catch (e) {
      page = { el: h("div.card.fatal", errorText(e)) };
    }
    if (nav !== navigation || !shell) {
      // another navigation, a logout or an expired session came first
      if (page.stop) page.stop();
      return;
    }
    current = page;
    const heading = page.el.querySelector("h1")?.textContent;
    document.title = heading ? `${heading} · TrioMQ` : "TrioMQ";
    clear(shell.main, page.el);
    if (page.mounted) page.mounted();
    window.scrollTo(0, 0);
    startTimer();
    return;
  }
  ctx.tab = null;
  markTab();
  clear(shell.main, h("div.card", h("h2", "Not found"), h("p", "No page at ", h("code", hash), ". ", h("a", { href: "#/" }, "Back to the overview"))));
}

// While the broker is unreachable one banner says so (instead of a toast per refresh); it goes
// away with the first refresh that works.
function offline(e) {
  let banner = document.getElementById("offline");
  if (!e) return banner?.remove();
  if (!banner) {
    banner = h("div#offline", { role: "alert" });
    root.prepend(banner);
  }
  clear(banner, `${e.message}. Retrying with each refresh…`);
}

async function refresh() {
  if (!current?.refresh || document.hidden) return;
  try {
    await current.refresh();
    offline(null);
  } catch (e) {
    if (e.status === 0) offline(e);
    else if (e.status !== 401) toast(errorText(e), "error");
  }
}

function stopTimer() {
  clearInterval(timer);
  timer = null;
}

function startTimer() {
  stopTimer();
  const seconds = Number(sessionStorage.getItem(REFRESH_KEY) || "5");
  if (seconds > 0) timer = setInterval(refresh, seconds * 1000);
}

// A 401 also answers a tag the user lacks ("Not monitoring user"): whoami tells whether the
// credentials themselves stopped working (user deleted, password changed).
let checking = false;
api.setUnauthorizedHandler(async () => {
  const token = api.credentials()?.token;
  if (checking || !token) return;
  checking = true;
  try {
    // an OAuth 2 token that expired ends the session as a changed password does
    await api.get("/api/whoami", { token, scheme: api.credentials()?.scheme });
  } catch (e) {
    if (e.status === 401 && api.credentials()?.token === token) {
      api.forgetCredentials();
      navigation++;
      shell = null;
      showLogin("Your session ended: please log in again.");
    }
  } finally {
    checking = false;
  }
});

window.addEventListener("hashchange", route);
route();
