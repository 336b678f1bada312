"""A real MCP client of the official Python SDK (1.x or 2.x), driven by Tether's tests.

Usage: agent.py http URL | agent.py stdio COMMAND [ARG...]

Connects to the gateway the way a new user's agent would (SDK defaults: 2.x negotiates
2026-07-28, 1.x 2025-11-25), uses tools, prompts, resources and completions of an upstream
named `up`, and prints one JSON object with what it saw. Failures are printed too, as strings,
so the test can say which step broke.
"""

import asyncio
import json
import sys
import traceback

import mcp

TWO = hasattr(mcp, "Client")


def text_of(content):
    return "".join(getattr(block, "text", "") for block in content)


async def scenario(session, report, protocol):
    report["protocol"] = protocol
    # The gateway answers before its upstreams are up; it announces them when they are.
    for _ in range(200):
        tools = await session.list_tools()
        report["tools"] = sorted(t.name for t in tools.tools)
        if "up__echo" in report["tools"]:
            break
        await asyncio.sleep(0.1)

    echo = await session.call_tool("up__echo", {"text": "from python"})
    report["echo"] = text_of(echo.content)
    report["echo_is_error"] = bool(echo.isError if hasattr(echo, "isError") else echo.is_error)

    progress = []

    async def on_progress(value, total, message):
        progress.append(value)

    slow = await session.call_tool("up__slow", {"ms": 450}, progress_callback=on_progress)
    report["slow"] = text_of(slow.content)
    report["progress"] = progress

    prompts = await session.list_prompts()
    report["prompts"] = sorted(p.name for p in prompts.prompts)
    prompt = await session.get_prompt("up__greet", {"name": "py"})
    report["prompt"] = "".join(getattr(m.content, "text", "") for m in prompt.messages)

    resources = await session.list_resources()
    report["resources"] = sorted(str(r.uri) for r in resources.resources)
    read = await session.read_resource("up://readme")
    report["read"] = "".join(getattr(c, "text", "") for c in read.contents)

    ref = mcp.types.PromptReference(type="ref/prompt", name="up__greet")
    completion = await session.complete(ref, {"name": "name", "value": "c"})
    report["completion"] = completion.completion.values

    try:
        await session.call_tool("nobody__nothing", {})
        report["unknown_tool"] = "no error"
    except Exception as error:  # the SDK raises the JSON-RPC error
        report["unknown_tool"] = str(error)


async def run_two(kind, target, report):
    if kind == "stdio":
        target = mcp.StdioServerParameters(command=target[0], args=target[1:])
    else:
        target = target[0]
    async with mcp.Client(target) as client:
        await scenario(client, report, client.protocol_version)


async def run_one(kind, target, report):
    from mcp import ClientSession

    if kind == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client

        transport = stdio_client(StdioServerParameters(command=target[0], args=target[1:]))
    else:
        from mcp.client.streamable_http import streamablehttp_client

        transport = streamablehttp_client(target[0])
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(read, write) as session:
            init = await session.initialize()
            await scenario(session, report, init.protocolVersion)


def main():
    kind, target = sys.argv[1], sys.argv[2:]
    report = {"sdk": getattr(mcp, "__version__", None) or ("2" if TWO else "1")}
    try:
        asyncio.run((run_two if TWO else run_one)(kind, target, report))
    except BaseException:
        report["failure"] = traceback.format_exc()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
