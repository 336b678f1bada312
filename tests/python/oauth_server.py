"""A local OAuth 2.1 authorization server + protected MCP resource server, for Tether's tests.

Usage: oauth_server.py [--port 0] [--token-lifetime SECONDS] [--scopes "mcp:basic"] [--sse]

With --sse the MCP server speaks legacy HTTP+SSE at /sse (and /messages/), the resource being
/sse; otherwise Streamable HTTP at /mcp.

Built on the official MCP Python SDK 1.x (`mcp.server.auth`), which serves the endpoints:
RFC 8414 metadata, RFC 9728 protected-resource metadata, RFC 7591 registration, /authorize
(PKCE S256), /token, and the bearer check on /mcp. This file only adds the in-memory provider,
the wiring and a control surface:

  POST /control/revoke  revoke every access and refresh token issued so far -> {"revoked": n}
  GET  /control/stats   counters (see Provider.stats)
  POST /control/bare-401 {"on": bool}  while on, every MCP request is answered 401 with no
                        challenge (no WWW-Authenticate), as some gateways in front of servers do

/authorize approves at once: it redirects to the client's redirect_uri with code and state.
Prints `listening http://127.0.0.1:PORT` on stdout once it accepts connections; logs go to stderr.
"""

import argparse
import asyncio
import logging
import math
import secrets
import signal
import socket
import sys
import time
from collections import OrderedDict

import uvicorn
from pydantic import AnyUrl
from starlette.requests import Request
from starlette.responses import JSONResponse

from mcp.server.auth.provider import (
    AccessToken,
    AuthorizationCode,
    AuthorizationParams,
    AuthorizeError,
    RefreshToken,
    TokenError,
    construct_redirect_uri,
)
from mcp.server.auth.settings import AuthSettings, ClientRegistrationOptions
from mcp.server.fastmcp import FastMCP
from mcp.shared.auth import InvalidRedirectUriError, OAuthClientInformationFull, OAuthToken

log = logging.getLogger("oauth_server")

# Bounds so a long test run cannot grow memory without limit; the oldest entries go first.
MAX_CLIENTS = 1_000
MAX_CODES = 1_000
MAX_TOKENS = 10_000
CODE_LIFETIME = 300.0
LOOPBACK_HOSTS = {"127.0.0.1", "[::1]", "::1", "localhost"}


class LoopbackClient(OAuthClientInformationFull):
    """A registered client whose loopback redirect URIs match on any port (RFC 8252 §7.3).

    The SDK compares redirect_uri with the registered ones exactly (AnyUrl equality)."""

    def validate_redirect_uri(self, redirect_uri: AnyUrl | None) -> AnyUrl:
        try:
            return super().validate_redirect_uri(redirect_uri)
        except InvalidRedirectUriError:
            if redirect_uri is None or not _is_loopback(redirect_uri):
                raise
            for registered in self.redirect_uris or []:
                if _is_loopback(registered) and _same_but_port(registered, redirect_uri):
                    return redirect_uri
            raise


def _is_loopback(url: AnyUrl) -> bool:
    return url.scheme == "http" and (url.host or "") in LOOPBACK_HOSTS


def _same_but_port(a: AnyUrl, b: AnyUrl) -> bool:
    return (a.host, a.path or "/", a.query) == (b.host, b.path or "/", b.query)


def _put(store: OrderedDict, key, value, limit: int) -> None:
    store[key] = value
    while len(store) > limit:
        store.popitem(last=False)


class Provider:
    """In-memory OAuthAuthorizationServerProvider (mcp.server.auth.provider) that approves everything."""

    def __init__(self, resource_url: str, scopes: list[str], token_lifetime: float):
        self.resource_url = resource_url
        self.scopes = scopes
        self.token_lifetime = token_lifetime
        self.clients: OrderedDict[str, LoopbackClient] = OrderedDict()
        self.codes: OrderedDict[str, AuthorizationCode] = OrderedDict()
        # access token -> (AccessToken, exact deadline); AccessToken.expires_at is whole seconds only.
        self.access: OrderedDict[str, tuple[AccessToken, float]] = OrderedDict()
        self.refresh: OrderedDict[str, RefreshToken] = OrderedDict()
        self.bare_401 = False
        self.stats = {
            "registrations": 0,
            "authorizations": 0,
            "code_exchanges": 0,
            "refreshes": 0,
            "refresh_failures": 0,
            "tool_calls": 0,
            "active_access_tokens": 0,
        }

    # -- clients

    async def get_client(self, client_id: str) -> OAuthClientInformationFull | None:
        return self.clients.get(client_id)

    async def register_client(self, client_info: OAuthClientInformationFull) -> None:
        _put(self.clients, client_info.client_id, LoopbackClient.model_validate(client_info.model_dump()), MAX_CLIENTS)
        self.stats["registrations"] += 1
        log.info("registered client %s (%s) redirect_uris=%s auth=%s scope=%s", client_info.client_id,
                 client_info.client_name, [str(u) for u in client_info.redirect_uris or []],
                 client_info.token_endpoint_auth_method, client_info.scope)

    # -- authorization code

    async def authorize(self, client: OAuthClientInformationFull, params: AuthorizationParams) -> str:
        # One resource lives here; refuse others now rather than mint tokens /mcp would reject.
        if params.resource is not None and not self._is_our_resource(params.resource):
            raise AuthorizeError("invalid_request", f"unknown resource {params.resource!r}; use {self.resource_url}")
        if params.scopes is not None:
            scopes = params.scopes
        elif client.scope:
            scopes = client.scope.split()
        else:
            scopes = list(self.scopes)
        code = AuthorizationCode(
            code=secrets.token_urlsafe(32),
            scopes=scopes,
            expires_at=time.time() + CODE_LIFETIME,
            client_id=client.client_id,
            code_challenge=params.code_challenge,
            redirect_uri=params.redirect_uri,
            redirect_uri_provided_explicitly=params.redirect_uri_provided_explicitly,
            resource=params.resource or self.resource_url,
        )
        _put(self.codes, code.code, code, MAX_CODES)
        self.stats["authorizations"] += 1
        return construct_redirect_uri(str(params.redirect_uri), code=code.code, state=params.state)

    async def load_authorization_code(self, client: OAuthClientInformationFull, authorization_code: str):
        code = self.codes.get(authorization_code)
        if code is None or code.client_id != client.client_id:
            return None
        return code

    async def exchange_authorization_code(self, client: OAuthClientInformationFull, authorization_code):
        if self.codes.pop(authorization_code.code, None) is None:  # single use
            raise TokenError("invalid_grant", "authorization code already used")
        self.stats["code_exchanges"] += 1
        return self._issue(client.client_id, authorization_code.scopes, authorization_code.resource)

    # -- refresh

    async def load_refresh_token(self, client: OAuthClientInformationFull, refresh_token: str):
        token = self.refresh.get(refresh_token)
        if token is None or token.client_id != client.client_id:
            # The SDK answers invalid_grant right after this; count it here, the only hook it gives.
            self.stats["refresh_failures"] += 1
            log.info("refresh refused for client %s: unknown, rotated or revoked token", client.client_id)
            return None
        return token

    async def exchange_refresh_token(self, client: OAuthClientInformationFull, refresh_token, scopes: list[str]):
        self.refresh.pop(refresh_token.token, None)  # rotation: the old one stops working
        self.stats["refreshes"] += 1
        return self._issue(client.client_id, scopes, refresh_token.resource)

    # -- access

    async def load_access_token(self, token: str) -> AccessToken | None:
        entry = self.access.get(token)
        if entry is None:
            return None
        if time.time() >= entry[1]:
            del self.access[token]
            return None
        return entry[0]

    async def revoke_token(self, token) -> None:
        self.access.pop(token.token, None)
        self.refresh.pop(token.token, None)

    # -- helpers

    def _issue(self, client_id: str, scopes: list[str], resource: str | None) -> OAuthToken:
        self._purge()
        now = time.time()
        deadline = now + self.token_lifetime
        access = AccessToken(
            token="at_" + secrets.token_urlsafe(32),
            client_id=client_id,
            scopes=scopes,
            expires_at=math.ceil(deadline),
            resource=resource or self.resource_url,
        )
        refresh = RefreshToken(
            token="rt_" + secrets.token_urlsafe(32), client_id=client_id, scopes=scopes, resource=access.resource
        )
        _put(self.access, access.token, (access, deadline), MAX_TOKENS)
        _put(self.refresh, refresh.token, refresh, MAX_TOKENS)
        return OAuthToken(
            access_token=access.token,
            # Whole seconds on the wire, rounded down so clients refresh before /mcp says 401.
            expires_in=int(self.token_lifetime),
            scope=" ".join(scopes) or None,
            refresh_token=refresh.token,
        )

    def _purge(self) -> None:
        now = time.time()
        for key in [k for k, (_, deadline) in self.access.items() if now >= deadline]:
            del self.access[key]
        for key in [k for k, c in self.codes.items() if now >= c.expires_at]:
            del self.codes[key]

    def _is_our_resource(self, resource: str) -> bool:
        try:
            return str(AnyUrl(resource)).rstrip("/") == self.resource_url.rstrip("/")
        except ValueError:
            return False

    def revoke_all(self) -> int:
        self._purge()
        n = len(self.access) + len(self.refresh)
        self.access.clear()
        self.refresh.clear()
        return n

    def snapshot(self) -> dict:
        self._purge()
        return {**self.stats, "active_access_tokens": len(self.access)}


def build(port: int, scopes: list[str], token_lifetime: float, path: str) -> tuple[FastMCP, Provider]:
    base = f"http://127.0.0.1:{port}"
    provider = Provider(f"{base}{path}", scopes, token_lifetime)
    mcp = FastMCP(
        "tether-oauth-test",
        auth_server_provider=provider,
        host="127.0.0.1",
        port=port,
        auth=AuthSettings(
            issuer_url=base,
            resource_server_url=f"{base}{path}",
            validate_token_resource=True,
            required_scopes=scopes or None,
            client_registration_options=ClientRegistrationOptions(
                enabled=True, valid_scopes=scopes or None, default_scopes=scopes or None
            ),
        ),
    )

    @mcp.tool(structured_output=False)
    def echo(text: str) -> str:
        """Echo the text back."""
        provider.stats["tool_calls"] += 1
        return text

    @mcp.custom_route("/control/revoke", methods=["POST"])
    async def control_revoke(request: Request) -> JSONResponse:
        n = provider.revoke_all()
        log.info("control: revoked %d tokens", n)
        return JSONResponse({"revoked": n})

    @mcp.custom_route("/control/bare-401", methods=["POST"])
    async def control_bare_401(request: Request) -> JSONResponse:
        provider.bare_401 = bool((await request.json())["on"])
        return JSONResponse({"on": provider.bare_401})

    @mcp.custom_route("/control/stats", methods=["GET"])
    async def control_stats(request: Request) -> JSONResponse:
        return JSONResponse(provider.snapshot())

    return mcp, provider


class BareUnauthorized:
    """While the provider's `bare_401` is on, answers MCP requests 401 with no challenge."""

    def __init__(self, app, provider: Provider, paths: tuple[str, ...]):
        self.app, self.provider, self.paths = app, provider, paths

    async def __call__(self, scope, receive, send):
        if self.provider.bare_401 and scope["type"] == "http" and scope["path"].startswith(self.paths):
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await self.app(scope, receive, send)


async def serve(sock: socket.socket, mcp: FastMCP, provider: Provider, port: int, sse: bool) -> None:
    app = mcp.sse_app() if sse else mcp.streamable_http_app()
    app = BareUnauthorized(app, provider, ("/sse", "/messages") if sse else ("/mcp",))
    config = uvicorn.Config(app, log_config=None, lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            await task  # startup failed: surface the error
            return
        await asyncio.sleep(0.01)
    print(f"listening http://127.0.0.1:{port}", flush=True)
    await task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--token-lifetime", type=float, default=3600.0)
    parser.add_argument("--scopes", default="mcp:basic", help="space-separated; empty for none")
    parser.add_argument("--sse", action="store_true", help="legacy HTTP+SSE at /sse")
    args = parser.parse_args()

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    # Bind first so the issuer and resource URLs can name the real port.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    port = sock.getsockname()[1]
    mcp, provider = build(port, args.scopes.split(), args.token_lifetime, "/sse" if args.sse else "/mcp")

    # uvicorn handles SIGTERM, then re-raises it under the handler that was there before; a
    # no-op one here makes that re-raise return, so the process exits 0 instead of dying by signal.
    signal.signal(signal.SIGTERM, lambda *_: None)
    asyncio.run(serve(sock, mcp, provider, port, args.sse))


if __name__ == "__main__":
    main()
