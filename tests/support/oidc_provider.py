"""An OpenID Connect provider on a loopback port, for the console's sign-in tests: discovery,
an authorization endpoint that signs in ``user`` at once (redirecting back with a code),
a token endpoint that checks the client, the redirect URI and the PKCE verifier, and the
JWKS its ID tokens are signed with (EC P-256, ES256)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import jwt

from tests.support.keys import ec_key, public_jwk
from tests.support.tls import server_context

CLIENT_ID = "gateway-console"
CLIENT_SECRET = "console-client-secret-0123456789"
KID = "oidc-ec-1"


class OidcProvider:
    def __init__(
        self, *, user: str = "carol", tenant: str = "acme", roles: list[str] | None = None, tls: bool = False
    ) -> None:
        self.user = user
        self.tenant = tenant
        self.roles = roles if roles is not None else ["admin"]
        self.nonce_override: str | None = None
        """When set, ID tokens carry this nonce instead of the one asked for."""
        self.extra_claims: dict[str, Any] = {}
        """Claims ID tokens carry besides (or in place of) the usual ones, e.g. ``aud``, ``azp``."""
        self.authorize_requests: list[dict[str, str]] = []
        self.token_requests: list[dict[str, str]] = []
        self.raw_answers: dict[str, bytes] = {}
        """A path's answer replaced by these bytes (a hostile provider), e.g. ``{"/token": b"..."}``."""
        self._codes: dict[str, dict[str, str]] = {}
        self._key = ec_key(KID)
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                url = urlsplit(self.path)
                query = {key: values[0] for key, values in parse_qs(url.query).items()}
                if url.path in provider.raw_answers:
                    self._raw(provider.raw_answers[url.path])
                elif url.path == "/.well-known/openid-configuration":
                    self._json(200, provider.discovery())
                elif url.path == "/jwks":
                    self._json(200, {"keys": [public_jwk(KID, provider._key, "ES256")]})
                elif url.path == "/authorize":
                    provider.authorize_requests.append(query)
                    code = secrets.token_urlsafe(16)
                    provider._codes[code] = query
                    self.send_response(302)
                    self.send_header("Location", query["redirect_uri"] + "?" + urlencode(
                        {"code": code, "state": query.get("state", "")}))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                else:
                    self._json(404, {"error": "not_found"})

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                form = {key: values[0] for key, values in parse_qs(self.rfile.read(length).decode()).items()}
                provider.token_requests.append(form)
                if "/token" in provider.raw_answers:
                    self._raw(provider.raw_answers["/token"])
                    return
                status, body = provider.token(form, self.headers.get("Authorization", ""))
                self._json(status, body)

            def _raw(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._scheme = "http"
        if tls:  # the certificate of tests.support.tls: a client trusts it with tls.client_context()
            self._httpd.socket = server_context().wrap_socket(self._httpd.socket, server_side=True)
            self._scheme = "https"
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def issuer(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"{self._scheme}://{host}:{port}"

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.issuer,
            "authorization_endpoint": f"{self.issuer}/authorize",
            "token_endpoint": f"{self.issuer}/token",
            "jwks_uri": f"{self.issuer}/jwks",
            "response_types_supported": ["code"],
            "code_challenge_methods_supported": ["S256"],
            "id_token_signing_alg_values_supported": ["ES256"],
        }

    def token(self, form: dict[str, str], authorization: str) -> tuple[int, dict[str, Any]]:
        expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
        if authorization != expected:
            return 401, {"error": "invalid_client"}
        asked = self._codes.pop(form.get("code", ""), None)
        if asked is None or form.get("grant_type") != "authorization_code":
            return 400, {"error": "invalid_grant"}
        challenge = base64.urlsafe_b64encode(
            hashlib.sha256(form.get("code_verifier", "").encode()).digest()
        ).rstrip(b"=").decode()
        if challenge != asked.get("code_challenge") or form.get("redirect_uri") != asked.get("redirect_uri"):
            return 400, {"error": "invalid_grant"}
        now = int(time.time())
        claims = {
            "iss": self.issuer, "aud": CLIENT_ID, "sub": self.user, "tenant_id": self.tenant, "roles": self.roles,
            "nonce": self.nonce_override if self.nonce_override is not None else asked.get("nonce"),
            "iat": now, "exp": now + 300, **self.extra_claims,
        }
        id_token = jwt.encode(claims, self._key, algorithm="ES256", headers={"kid": KID})
        return 200, {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer", "id_token": id_token}

    def settings(self) -> dict[str, str]:
        """The gateway settings (``name=value``) that point the console at this provider."""
        return {"oidc_issuer": self.issuer, "oidc_client_id": CLIENT_ID, "oidc_client_secret": CLIENT_SECRET}

    def __enter__(self) -> OidcProvider:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
