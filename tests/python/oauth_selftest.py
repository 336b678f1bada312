"""Self-test of oauth_server.py, driven by the MCP Python SDK's own OAuth client.

Usage: oauth_selftest.py [-v]   (run with the venv that has mcp 1.x; -v shows the server's log)

Part A (server started with --token-lifetime 1): OAuthClientProvider registers, authorizes
(a "browser" that only follows the /authorize redirect with httpx), calls echo, waits past the
token lifetime, calls again (the SDK refreshes), then POST /control/revoke and the next call
must fail to authorize (the "user" now declines the new authorization the SDK asks for).
Part B (long token lifetime, raw HTTP): confidential clients (client_secret_post/basic), any
loopback port, PKCE/code/redirect checks, refresh rotation, and revocation before expiry.
Exits non-zero on the first failed check.
"""

import asyncio
import base64
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
from datetime import timedelta
from urllib.parse import parse_qs, urlparse

import httpx

from mcp import ClientSession
from mcp.client.auth import OAuthClientProvider, TokenStorage
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import OAuthClientInformationFull, OAuthClientMetadata, OAuthToken

HERE = os.path.dirname(os.path.abspath(__file__))
VERBOSE = "-v" in sys.argv[1:]
CALLBACK = "http://127.0.0.1:53682/callback"  # nothing listens: the redirect is captured, not followed


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print(f"  ok  {what}")


class Server:
    def __init__(self, *args: str):
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "oauth_server.py"), "--port", "0", *args],
            stdout=subprocess.PIPE,
            stderr=None if VERBOSE else self.log,
            text=True,
        )
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening http://127.0.0.1:"):
            self.dump()
            raise AssertionError(f"unexpected first line {line!r}")
        self.base = line.split(" ", 1)[1]

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=15)

    def dump(self):
        self.log.seek(0)
        sys.stderr.write(self.log.read())


class MemoryStorage(TokenStorage):
    def __init__(self):
        self.tokens: OAuthToken | None = None
        self.client_info: OAuthClientInformationFull | None = None
        self.history: list[OAuthToken] = []

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens
        self.history.append(tokens)

    async def get_client_info(self):
        return self.client_info

    async def set_client_info(self, client_info):
        self.client_info = client_info


class Browser:
    """Opens the authorization URL without a browser: the server redirects at once to the callback."""

    def __init__(self):
        self.result: tuple[str, str | None] | None = None
        self.decline = False
        self.visits = 0

    async def redirect_handler(self, url: str) -> None:
        self.visits += 1
        if self.decline:
            raise RuntimeError("the user declined the authorization")
        async with httpx.AsyncClient() as http:
            response = await http.get(url)
        assert response.status_code == 302, (response.status_code, response.text)
        location = response.headers["location"]
        assert location.startswith(CALLBACK + "?"), location
        query = parse_qs(urlparse(location).query)
        self.result = (query["code"][0], query.get("state", [None])[0])

    async def callback_handler(self) -> tuple[str, str | None]:
        assert self.result is not None
        result, self.result = self.result, None
        return result


async def stats(http: httpx.AsyncClient, base: str) -> dict:
    return (await http.get(f"{base}/control/stats")).json()


async def mcp_status(http: httpx.AsyncClient, base: str, token: str) -> httpx.Response:
    """POST an initialize with a bearer token; the status says whether /mcp accepted it."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}},
    }
    headers = {"Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"}
    return await http.post(f"{base}/mcp", json=body, headers=headers)


async def refresh_grant(http, base, client_id, refresh_token, secret=None) -> httpx.Response:
    data = {"grant_type": "refresh_token", "refresh_token": refresh_token, "client_id": client_id}
    if secret:
        data["client_secret"] = secret
    return await http.post(f"{base}/token", data=data)


def leaves(e: BaseException | None) -> list[str]:
    if isinstance(e, BaseExceptionGroup):
        return [x for sub in e.exceptions for x in leaves(sub)]
    return [f"{type(e).__name__}: {e}"]


def text_of(result) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def sdk_session(base, oauth, storage, browser, http, state) -> None:
    """Everything in one MCP session; ends by a call that must fail to authorize."""
    async with httpx.AsyncClient(auth=oauth, timeout=30) as mcp_http:
        async with streamable_http_client(f"{base}/mcp", http_client=mcp_http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                check([t.name for t in tools.tools] == ["echo"], "tools/list shows only echo")
                result = await session.call_tool("echo", {"text": "hello"})
                check(text_of(result) == "hello" and not result.isError, "echo answers 'hello'")
                s = await stats(http, base)
                check(
                    (s["registrations"], s["authorizations"], s["code_exchanges"]) == (1, 1, 1),
                    f"one registration, authorization, code exchange: {s}",
                )
                check(storage.client_info.token_endpoint_auth_method == "none", "registered as a public client")
                check(storage.tokens.expires_in == 1 and storage.tokens.refresh_token, "expires_in=1, refresh token")
                first = storage.tokens

                await asyncio.sleep(2.2)
                check((await mcp_status(http, base, first.access_token)).status_code == 401, "expired token -> 401")
                result = await session.call_tool("echo", {"text": "after expiry"})
                check(text_of(result) == "after expiry", "echo works after the token expired")
                s = await stats(http, base)
                check(s["refreshes"] == 1 and s["code_exchanges"] == 1, f"the SDK refreshed, no new login: {s}")
                check(storage.tokens.refresh_token != first.refresh_token, "refresh token rotated")
                r = await refresh_grant(http, base, storage.client_info.client_id, first.refresh_token)
                check(r.status_code == 400 and r.json()["error"] == "invalid_grant", f"old refresh token refused: {r.text}")

                revoked = (await http.post(f"{base}/control/revoke")).json()
                print(f"  ..  POST /control/revoke -> {revoked}")
                check(revoked["revoked"] >= 1, "revoke reports what it revoked")
                r = await refresh_grant(http, base, storage.client_info.client_id, storage.tokens.refresh_token)
                check(r.status_code == 400 and r.json()["error"] == "invalid_grant", "revoked refresh token refused")

                await asyncio.sleep(1.2)  # past expiry, so the SDK first tries its (revoked) refresh token
                browser.decline = True
                state["visits"], state["failures"] = browser.visits, (await stats(http, base))["refresh_failures"]
                state["expect_failure"] = True
                await session.call_tool("echo", {"text": "after revoke"}, read_timeout_seconds=timedelta(seconds=10))


async def part_a() -> None:
    print("part A: SDK OAuth client against --token-lifetime 1")
    server = Server("--token-lifetime", "1")
    try:
        base = server.base
        storage, browser = MemoryStorage(), Browser()
        oauth = OAuthClientProvider(
            server_url=f"{base}/mcp",
            client_metadata=OAuthClientMetadata(
                client_name="oauth-selftest",
                redirect_uris=[CALLBACK],
                grant_types=["authorization_code", "refresh_token"],
                response_types=["code"],
                token_endpoint_auth_method="none",
            ),
            storage=storage,
            redirect_handler=browser.redirect_handler,
            callback_handler=browser.callback_handler,
        )
        state = {"expect_failure": False}
        async with httpx.AsyncClient() as http:
            failed = None
            try:
                await sdk_session(base, oauth, storage, browser, http, state)
            except BaseException as e:
                # SDK 1.30: a failed re-authorization is raised out of the transport's task group,
                # ending the whole connection, not just this call.
                if not state["expect_failure"]:
                    raise
                failed = e
            check(failed is not None, f"call after revoke fails: {leaves(failed)}")
            s = await stats(http, base)
            check(s["refresh_failures"] == state["failures"] + 1, "the SDK's refresh was refused")
            check(browser.visits == state["visits"] + 1, "the SDK then asked for a new authorization (declined)")
            check(s["tool_calls"] == 2, "the tool did not run")
            print(f"  ..  stats: {json.dumps(s)}")
    except BaseException:
        server.dump()
        raise
    finally:
        rc = server.stop()
    check(rc == 0, f"server exits 0 on SIGTERM (rc={rc})")


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
    return verifier, challenge


async def login(http, base, method, registered, used=None, resource=True):
    """Register a client with `method`, authorize with redirect `used`, exchange the code."""
    reg = await http.post(
        f"{base}/register",
        json={"client_name": f"raw-{method}", "redirect_uris": [registered], "token_endpoint_auth_method": method},
    )
    assert reg.status_code == 201, reg.text
    client = reg.json()
    verifier, challenge = pkce()
    params = {
        "response_type": "code",
        "client_id": client["client_id"],
        "redirect_uri": used or registered,
        "state": "st-" + method,
        "code_challenge": challenge,
        "code_challenge_method": "S256",
    }
    if resource:
        params["resource"] = f"{base}/mcp"
    r = await http.get(f"{base}/authorize", params=params)
    assert r.status_code == 302, (r.status_code, r.text)
    loc = urlparse(r.headers["location"])
    query = parse_qs(loc.query)
    assert f"{loc.scheme}://{loc.netloc}{loc.path}" == (used or registered), loc
    assert query["state"] == ["st-" + method], query
    data = {
        "grant_type": "authorization_code",
        "code": query["code"][0],
        "redirect_uri": used or registered,
        "client_id": client["client_id"],
        "code_verifier": verifier,
    }
    auth = None
    if method == "client_secret_post":
        data["client_secret"] = client["client_secret"]
    elif method == "client_secret_basic":
        auth = (client["client_id"], client["client_secret"])
    tok = await http.post(f"{base}/token", data=data, auth=auth)
    return client, data, auth, tok


async def part_b() -> None:
    print("part B: raw HTTP against --token-lifetime 60")
    server = Server("--token-lifetime", "60")
    try:
        base = server.base
        async with httpx.AsyncClient() as http:
            tokens = {}
            for method in ("none", "client_secret_post", "client_secret_basic"):
                client, data, auth, tok = await login(http, base, method, "http://127.0.0.1:40001/cb")
                check(tok.status_code == 200 and tok.json()["expires_in"] == 60, f"{method}: code -> tokens")
                check((await mcp_status(http, base, tok.json()["access_token"])).status_code == 200, f"{method}: /mcp accepts")
                tokens[method] = (client, tok.json())
                again = await http.post(f"{base}/token", data=data, auth=auth)
                check(again.status_code == 400 and again.json()["error"] == "invalid_grant", f"{method}: code is single-use")

            _, _, _, tok = await login(http, base, "none", "http://127.0.0.1:40001/cb", used="http://127.0.0.1:51234/cb")
            check(tok.status_code == 200, "registered loopback port 40001, used port 51234: accepted (RFC 8252)")
            _, _, _, tok = await login(http, base, "none", "http://127.0.0.1:40001/cb", resource=False)
            check(tok.status_code == 200, "no resource parameter: accepted, token bound to /mcp")
            check((await mcp_status(http, base, tok.json()["access_token"])).status_code == 200, "  and /mcp accepts it")

            reg = (await http.post(f"{base}/register", json={"redirect_uris": ["http://127.0.0.1:40001/cb"], "token_endpoint_auth_method": "none"})).json()
            verifier, challenge = pkce()
            common = {"response_type": "code", "client_id": reg["client_id"], "code_challenge": challenge, "state": "x"}
            r = await http.get(f"{base}/authorize", params={**common, "redirect_uri": "http://127.0.0.1:40001/other"})
            check(r.status_code == 400, f"loopback with another path refused: {r.text}")
            r = await http.get(f"{base}/authorize", params={**common, "redirect_uri": "http://evil.example:40001/cb"})
            check(r.status_code == 400, "non-loopback redirect_uri refused")
            r = await http.get(f"{base}/authorize", params={**common, "resource": "http://127.0.0.1:1/elsewhere"})
            check(r.status_code == 302 and "error=invalid_request" in r.headers["location"], "foreign resource refused")
            r = await http.get(f"{base}/authorize", params={**common, "code_challenge_method": "plain"})
            check(r.status_code == 302 and "error=invalid_request" in r.headers["location"], "PKCE plain refused")
            r = await http.get(f"{base}/authorize", params=common)
            code = parse_qs(urlparse(r.headers["location"]).query)["code"][0]
            r = await http.post(f"{base}/token", data={"grant_type": "authorization_code", "code": code, "client_id": reg["client_id"], "code_verifier": "x" * 50})
            check(r.status_code == 400 and r.json()["error"] == "invalid_grant", "wrong PKCE verifier refused")

            client, tok = tokens["client_secret_post"]
            r = await refresh_grant(http, base, client["client_id"], tok["refresh_token"])
            check(r.status_code == 401, f"refresh without the client secret refused: {r.text}")
            r = await refresh_grant(http, base, client["client_id"], tok["refresh_token"], client["client_secret"])
            check(r.status_code == 200 and r.json()["refresh_token"] != tok["refresh_token"], "refresh grant rotates")
            new = r.json()
            r = await refresh_grant(http, base, client["client_id"], tok["refresh_token"], client["client_secret"])
            check(r.status_code == 400 and r.json()["error"] == "invalid_grant", "old refresh token refused")
            check((await mcp_status(http, base, new["access_token"])).status_code == 200, "refreshed access token works")

            before = await stats(http, base)
            revoked = (await http.post(f"{base}/control/revoke")).json()
            check(revoked == {"revoked": before["active_access_tokens"] + 5}, f"revoke: {revoked}, before: {before}")
            r = await mcp_status(http, base, new["access_token"])
            check(r.status_code == 401, f"unexpired but revoked access token -> 401; WWW-Authenticate: {r.headers['www-authenticate']}")
            r = await refresh_grant(http, base, client["client_id"], new["refresh_token"], client["client_secret"])
            check(r.status_code == 400 and r.json()["error"] == "invalid_grant", "revoked refresh token -> invalid_grant")
            print(f"  ..  stats: {json.dumps(await stats(http, base))}")
    except BaseException:
        server.dump()
        raise
    finally:
        rc = server.stop()
    check(rc == 0, f"server exits 0 on SIGTERM (rc={rc})")


async def main() -> None:
    if not VERBOSE:
        logging.getLogger("mcp.client.auth").setLevel(logging.CRITICAL)
    await part_a()
    await part_b()
    print("PASS")


if __name__ == "__main__":
    asyncio.run(main())
