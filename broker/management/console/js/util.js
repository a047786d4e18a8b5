// DOM building and formatting helpers shared by every page.

// h("div.card#id", {attrs, on: {click}}, ...children): a tiny element builder (text is never parsed as HTML).
export function h(tag, attrs, ...children) {
  const [name, ...rest] = tag.split(/(?=[.#])/);
  const el = document.createElement(name || "div");
  for (const part of rest) {
    if (part[0] === ".") el.classList.add(part.slice(1));
    else el.id = part.slice(1);
  }
  if (attrs && (typeof attrs !== "object" || attrs instanceof Node || Array.isArray(attrs))) {
    children.unshift(attrs);
    attrs = null;
  }
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === "class") el.className = v;
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k in el && typeof v !== "string") el[k] = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

export function clear(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const intFmt = new Intl.NumberFormat("en-US");
const rateFmt = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1, minimumFractionDigits: 1 });

export const num = (n) => (n === undefined || n === null ? "" : intFmt.format(n));
export const rate = (n) => (n === undefined || n === null ? "" : `${rateFmt.format(n)}/s`);

export function bytes(n) {
  if (n === undefined || n === null) return "";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

export function duration(seconds) {
  if (seconds === undefined || seconds === null) return "";
  const d = Math.floor(seconds / 86400), hr = Math.floor((seconds % 86400) / 3600);
  const m = Math.floor((seconds % 3600) / 60), s = Math.floor(seconds % 60);
  if (d) return `${d}d ${hr}h`;
  if (hr) return `${hr}h ${m}m`;
  return m ? `${m}m ${s}s` : `${s}s`;
}

// "rate of X" from a *_details object, as the API nests them.
export const detail = (stats, key) => stats?.[`${key}_details`]?.rate;

export function tags(list) {
  if (!list) return [];
  const arr = Array.isArray(list) ? list : String(list).split(",").map((t) => t.trim()).filter(Boolean);
  return arr.map((t) => h("span.tag", t));
}

export function yesno(v) {
  return v ? h("span.pill.pill-on", "yes") : h("span.pill", "no");
}

export function vhostLabel(v) {
  return v === "/" ? h("span.mono", "/") : v;
}

// A compact display of an arguments or definition object: key = value chips.
export function args(obj) {
  const entries = Object.entries(obj || {});
  if (!entries.length) return h("span.muted", "none");
  return h("div.kv", entries.map(([k, v]) => h("span.arg", h("b", k), ": ", typeof v === "string" ? v : JSON.stringify(v))));
}

// Toasts for results and API errors.
export function toast(message, kind = "ok") {
  let box = document.getElementById("toasts");
  if (!box) document.body.append((box = h("div#toasts")));
  const t = h(`div.toast.toast-${kind}`, { role: kind === "error" ? "alert" : "status" }, message);
  box.append(t);
  setTimeout(() => t.remove(), kind === "error" ? 8000 : 3500);
}

export function errorText(e) {
  if (e?.status === 0) return e.message;
  if (e?.status) return `${e.status} ${e.error}: ${e.reason}`;
  return String(e?.message || e);
}

// Runs an API action from a button or form: disables it while running, toasts the outcome.
export async function act(fn, ok, control) {
  if (control) control.disabled = true;
  try {
    const result = await fn();
    if (ok) toast(ok);
    return result;
  } catch (e) {
    toast(errorText(e), "error");
    return undefined;
  } finally {
    if (control) control.disabled = false;
  }
}

export function confirmDialog(text) {
  return window.confirm(text);
}

// A typed value from an argument row: number, boolean, list (JSON) or string.
export function typedValue(raw, type) {
  switch (type) {
    case "number": {
      const n = Number(raw);
      if (raw.trim() === "" || Number.isNaN(n)) throw new Error(`"${raw}" is not a number`);
      return n;
    }
    case "boolean":
      return raw === "true";
    case "list":
      try { return JSON.parse(raw); } catch { throw new Error(`"${raw}" is not a JSON list`); }
    default:
      return raw;
  }
}

export function download(filename, text) {
  const url = URL.createObjectURL(new Blob([text], { type: "application/json" }));
  const a = h("a", { href: url, download: filename });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
