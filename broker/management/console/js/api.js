// The management API client: basic auth from sessionStorage, JSON in and out, errors as ApiError.
const KEY = "triomq.auth";

export class ApiError extends Error {
  constructor(status, error, reason) {
    super(reason || error || `HTTP ${status}`);
    this.status = status;
    this.error = error;
    this.reason = reason;
  }
}

export function credentials() {
  const raw = sessionStorage.getItem(KEY);
  return raw ? JSON.parse(raw) : null;
}

// The basic-auth token: base64 of UTF-8, so non-ASCII user names and passwords survive btoa.
export function basicToken(username, password) {
  const bytes = new TextEncoder().encode(`${username}:${password}`);
  return btoa(String.fromCharCode(...bytes));
}

export function saveCredentials(username, password) {
  sessionStorage.setItem(KEY, JSON.stringify({ username, token: basicToken(username, password) }));
}

// An OAuth 2 access token (the console's OIDC login): sent as "Authorization: Bearer".
export function saveBearer(username, accessToken) {
  sessionStorage.setItem(KEY, JSON.stringify({ username, token: accessToken, scheme: "Bearer" }));
}

export function forgetCredentials() {
  sessionStorage.removeItem(KEY);
}

// Vhost and object names are path segments: "/" becomes %2F as RabbitMQ expects.
export const enc = (s) => encodeURIComponent(s);

export function path(strings, ...values) {
  return strings.reduce((out, s, i) => out + s + (i < values.length ? enc(values[i]) : ""), "");
}

let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

const unreachable = (e) => new ApiError(0, "network", `The broker is not reachable (${e.message})`);

export async function request(method, url, body, { token, scheme, headers = {}, raw = false } = {}) {
  const auth = token ?? credentials()?.token;
  const authScheme = token !== undefined ? scheme || "Basic" : credentials()?.scheme || "Basic";
  // credentials "omit": a 401 comes back to the page instead of opening the browser's own
  // basic-auth prompt, and the browser's cached credentials are never sent instead of ours.
  const init = { method, headers: { ...headers }, cache: "no-store", credentials: "omit" };
  if (auth) init.headers.Authorization = `${authScheme} ${auth}`;
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = typeof body === "string" ? body : JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(url, init);
  } catch (e) {
    throw unreachable(e);
  }
  // Only a refusal of the session's current credentials ends it (not a request still in
  // flight from before a logout).
  if (response.status === 401 && token === undefined && auth && auth === credentials()?.token) onUnauthorized();
  if (!response.ok) {
    let error = `HTTP ${response.status}`;
    let reason = response.statusText;
    try {
      const data = await response.json();
      error = data.error ?? error;
      reason = data.reason ?? reason;
    } catch { /* not JSON: keep the status line */ }
    throw new ApiError(response.status, error, typeof reason === "string" ? reason : JSON.stringify(reason));
  }
  if (raw) return response;
  if (response.status === 204) return null;
  let text;
  try {
    text = await response.text();
  } catch (e) {
    // the connection went down after the headers (a broker stopping mid-response): as
    // unreachable as a refused connection, not an error of the request
    throw unreachable(e);
  }
  return text ? JSON.parse(text) : null;
}

export const get = (url, opts) => request("GET", url, undefined, opts);
export const put = (url, body, opts) => request("PUT", url, body ?? {}, opts);
export const post = (url, body, opts) => request("POST", url, body ?? {}, opts);
export const del = (url, opts) => request("DELETE", url, undefined, opts);

// A list endpoint with RabbitMQ's paging parameters; always answers the paged shape.
export async function page(url, { page = 1, pageSize = 100, name = "", regex = false, sort = "", reverse = false } = {}) {
  const q = new URLSearchParams({ page, page_size: pageSize, name, use_regex: regex, pagination: true });
  if (sort) {
    q.set("sort", sort);
    q.set("sort_reverse", reverse);
  }
  const data = await get(`${url}?${q}`);
  if (Array.isArray(data)) {
    return { items: data, page: 1, page_count: 1, page_size: data.length, filtered_count: data.length,
             item_count: data.length, total_count: data.length };
  }
  return data;
}
