"""The console's OAuth 2 login (RabbitMQ's management.oauth_*) in headless Chromium: the
authorization code flow with PKCE against a tiny OpenID provider this module runs
(http.server on a free 127.0.0.1 port: discovery, an authorization endpoint that approves
at once, a token endpoint that checks the code verifier and signs a JWT with a key made
here); the broker takes that token as the API's Bearer token (--oauth2-*)."""
from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlencode, urlparse

import httpx
import jwt
import pytest
from brokerproc import BrokerProc
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from .conftest import chromium_path

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="no chromium")

CLIENT_ID = "triomq-console"
SCOPES = "openid profile rabbitmq.tag:administrator"
ADMIN = "rabbitmq.tag:administrator rabbitmq.configure:*/* rabbitmq.write:*/* rabbitmq.read:*/*"


class Provider:
    """An OpenID provider for one public client: codes are good once and only with the
    verifier whose S256 challenge the authorization request carried."""

    def __init__(self, key):
        self.key = key
        self.codes: dict[str, dict] = {}
        self.authorize_requests: list[dict] = []
        self.verified = 0  # token requests whose code verifier matched
        self.refuse: str | None = None  # an error code the authorization endpoint answers
        self.scope = ADMIN  # the scopes the tokens carry
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _json(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Access-Control-Allow-Origin", "*")  # the console's fetch
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                url = urlparse(self.path)
                if url.path == "/.well-known/openid-configuration":
                    return self._json(200, {"issuer": outer.url,
                                            "authorization_endpoint": outer.url + "/authorize",
                                            "token_endpoint": outer.url + "/token"})
                if url.path != "/authorize":
                    return self._json(404, {"error": "not_found"})
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                outer.authorize_requests.append(q)
                answer = {"state": q.get("state", "")}
                if outer.refuse:
                    answer["error"] = outer.refuse
                elif (q.get("client_id") != CLIENT_ID or q.get("response_type") != "code"
                        or q.get("code_challenge_method") != "S256"):
                    answer["error"] = "invalid_request"
                else:
                    code = secrets.token_urlsafe(16)
                    outer.codes[code] = q
                    answer["code"] = code
                self.send_response(302)
                self.send_header("Location", q["redirect_uri"] + "?" + urlencode(answer))
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self):
                form = {k: v[0] for k, v in parse_qs(
                    self.rfile.read(int(self.headers.get("Content-Length", 0))).decode()).items()}
                asked = outer.codes.pop(form.get("code", ""), None)
                if asked is None or form.get("grant_type") != "authorization_code" \
                        or form.get("redirect_uri") != asked["redirect_uri"] \
                        or form.get("client_id") != CLIENT_ID:
                    return self._json(400, {"error": "invalid_grant"})
                digest = hashlib.sha256(form.get("code_verifier", "").encode()).digest()
                if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != asked["code_challenge"]:
                    return self._json(400, {"error": "invalid_grant"})
                outer.verified += 1
                now = int(time.time())
                token = jwt.encode({"sub": "alice-id", "user_name": "alice", "aud": "rabbitmq",
                                    "iat": now, "exp": now + 600, "scope": outer.scope},
                                   outer.key, algorithm="RS256", headers={"kid": "idp-1"})
                return self._json(200, {"access_token": token, "token_type": "Bearer",
                                        "expires_in": 600})

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def provider():
    p = Provider(rsa.generate_private_key(public_exponent=65537, key_size=2048))
    yield p
    p.close()


@pytest.fixture(scope="module")
def broker_proc(tmp_path_factory, provider):
    """The console tests' broker (overrides conftest's): tokens of the provider's key, and
    the console's OAuth 2 login pointed at the provider."""
    tmp = tmp_path_factory.mktemp("console-oauth")
    pem = tmp / "idp.pem"
    pem.write_bytes(provider.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    proc = BrokerProc(tmp / "data", store="memory", http=True, extra=[
        "--oauth2-resource-server-id", "rabbitmq", "--oauth2-signing-key", f"idp-1={pem}",
        "--oauth2-preferred-username-claims", "user_name",
        "--management-oauth-client-id", CLIENT_ID,
        "--management-oauth-provider-url", provider.url,
        "--management-oauth-scopes", SCOPES]).start()
    deadline = time.monotonic() + 30
    while True:  # the HTTP listener may come up just after the AMQP one
        try:
            if httpx.get(proc.http_url + "/api/auth", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"management API did not answer:\n{proc.log()}", pytrace=False)
        time.sleep(0.1)
    yield proc
    proc.stop()


def test_api_auth_as_rabbitmq(broker_proc, provider):
    """/api/auth (no login): RabbitMQ 3.10's keys and 3.11's, naming the client and provider."""
    ours = httpx.get(broker_proc.http_url + "/api/auth", timeout=10).json()
    assert ours["oauth_enabled"] is True and ours["enable_uaa"] is True
    assert (ours["oauth_client_id"], ours["oauth_provider_url"]) == (CLIENT_ID, provider.url)
    assert ours["oauth_scopes"] == SCOPES
    try:
        reference = httpx.get("http://127.0.0.1:15672/api/auth", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return  # RabbitMQ's management plugin is off: the keys above are its 3.10/3.11 ones
    assert set(reference) <= set(ours)


def test_console_logs_in_with_the_provider(page, broker_proc, provider):
    provider.refuse = None
    page.click("#oauth-login")
    page.wait_for_selector("#whoami")
    assert page.text_content("#whoami") == "alice"
    assert "administrator" in page.text_content(".whoami")
    # PKCE: the provider got an S256 challenge and checked the verifier before it gave a token
    assert provider.verified == 1
    asked = provider.authorize_requests[-1]
    assert asked["code_challenge_method"] == "S256" and len(asked["code_challenge"]) == 43
    assert asked["scope"] == SCOPES
    assert asked["redirect_uri"] == broker_proc.http_url + "/"
    # the code is gone from the address bar; the session holds a Bearer token, no password
    assert "code=" not in page.url
    stored = json.loads(page.evaluate("sessionStorage.getItem('triomq.auth')"))
    assert stored["scheme"] == "Bearer" and stored["username"] == "alice"
    # the pages load with it (the queues page calls /api/queues with the token)
    page.click("a.tab[data-tab=queues]")
    page.wait_for_selector("h1:has-text('Queues')")
    page.click("#logout")
    page.wait_for_selector("#oauth-login")


def test_console_shows_a_refused_login(page, provider):
    provider.refuse = "access_denied"
    try:
        page.click("#oauth-login")
        page.wait_for_selector(".login-error:has-text('access_denied')")
        assert page.evaluate("sessionStorage.getItem('triomq.auth')") is None
    finally:
        provider.refuse = None


def test_console_refuses_a_token_without_management_tag(page, provider):
    provider.scope = "rabbitmq.read:*/*"
    try:
        page.click("#oauth-login")
        page.wait_for_selector(".login-error:has-text('Not a management user')")
        assert page.evaluate("sessionStorage.getItem('triomq.auth')") is None
    finally:
        provider.scope = ADMIN


def test_a_replayed_answer_is_refused(page, broker_proc, provider):
    """An answer this tab did not ask for (no pending request, foreign state) gives no session."""
    page.goto(broker_proc.http_url + "/?code=stolen&state=forged")
    page.wait_for_selector(".login-error:has-text('state mismatch')")
    assert page.evaluate("sessionStorage.getItem('triomq.auth')") is None
