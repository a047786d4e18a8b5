// The console's OAuth 2 login, as RabbitMQ's management UI with management.oauth_*: the
// authorization code flow with PKCE (RFC 7636, S256) against the OpenID provider /api/auth
// names; the access token it gives is then the API's Bearer token.
//
// The console is a public client (no secret): the code verifier, kept in sessionStorage for
// the one round trip, is what ties the code to this browser tab; the state ties the answer to
// the request this tab made.
const PENDING = "triomq.oidc";

function base64url(bytes) {
  return btoa(String.fromCharCode(...new Uint8Array(bytes))).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function randomString() {
  return base64url(crypto.getRandomValues(new Uint8Array(32)));
}

// The console's own address (no query, no hash): where the provider sends the browser back.
export function redirectUri() {
  return `${location.origin}${location.pathname}`;
}

async function discover(providerUrl) {
  const url = `${providerUrl.replace(/\/+$/, "")}/.well-known/openid-configuration`;
  let response;
  try {
    response = await fetch(url, { cache: "no-store", credentials: "omit" });
  } catch (e) {
    throw new Error(`The identity provider is not reachable (${e.message})`);
  }
  if (!response.ok) throw new Error(`The identity provider's discovery document answered HTTP ${response.status}`);
  const doc = await response.json();
  if (!doc.authorization_endpoint || !doc.token_endpoint) {
    throw new Error("The identity provider's discovery document names no authorization or token endpoint");
  }
  return doc;
}

// Leaves the page for the provider's authorization endpoint.
export async function beginLogin(auth) {
  const doc = await discover(auth.oauth_provider_url);
  const verifier = randomString();
  const state = randomString();
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier));
  sessionStorage.setItem(PENDING, JSON.stringify({
    verifier, state, tokenEndpoint: doc.token_endpoint, clientId: auth.oauth_client_id,
    redirectUri: redirectUri(), hash: location.hash,
  }));
  const q = new URLSearchParams({
    response_type: "code", client_id: auth.oauth_client_id, redirect_uri: redirectUri(),
    scope: auth.oauth_scopes || "openid", state, code_challenge: base64url(digest),
    code_challenge_method: "S256",
  });
  location.assign(`${doc.authorization_endpoint}?${q}`);
}

// True when this page load is the provider's answer (?code=...&state=... or ?error=...).
export function isCallback() {
  const q = new URLSearchParams(location.search);
  return q.has("state") && (q.has("code") || q.has("error"));
}

// Trades the code for tokens; returns {accessToken, hash}. Throws with a message for the login
// page. The query is removed from the address bar either way (a code is good once).
export async function completeLogin() {
  const q = new URLSearchParams(location.search);
  const pending = JSON.parse(sessionStorage.getItem(PENDING) || "null");
  sessionStorage.removeItem(PENDING);
  history.replaceState(null, "", redirectUri() + (pending?.hash || ""));
  if (q.has("error")) {
    throw new Error(`The identity provider refused the login: ${q.get("error")}${q.get("error_description") ? ` (${q.get("error_description")})` : ""}`);
  }
  if (!pending || pending.state !== q.get("state")) {
    throw new Error("This login answer was not asked for by this tab (state mismatch): log in again.");
  }
  const body = new URLSearchParams({
    grant_type: "authorization_code", code: q.get("code"), redirect_uri: pending.redirectUri,
    client_id: pending.clientId, code_verifier: pending.verifier,
  });
  let response;
  try {
    response = await fetch(pending.tokenEndpoint, { method: "POST", body, cache: "no-store", credentials: "omit" });
  } catch (e) {
    throw new Error(`The identity provider's token endpoint is not reachable (${e.message})`);
  }
  let data = {};
  try {
    data = await response.json();
  } catch { /* not JSON: the status says it */ }
  if (!response.ok || !data.access_token) {
    throw new Error(`The identity provider did not give a token: ${data.error || `HTTP ${response.status}`}`);
  }
  return { accessToken: data.access_token, hash: pending.hash || "" };
}
