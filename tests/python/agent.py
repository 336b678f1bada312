"""A real MCP client of the official Python SDK (1.x or 2.x), driven by Tether's tests.

Usage: agent.py http URL | agent.py stdio COMMAND [ARG...]
       agent.py ask http URL | agent.py ask stdio COMMAND [ARG...]

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


# `ask`: a client that answers what servers ask of it. Every tool whose name ends in
# `test_sampling` or `test_elicitation` is called; the server asks this client (sampling, an
# elicitation) during the call, and the report has each tool's answer and what was asked.

async def on_sampling(context, params):
    asked = ASKED.setdefault("sampling", [])
    text = "".join(
        getattr(block, "text", "")
        for message in params.messages
        for block in (message.content if isinstance(message.content, list) else [message.content])
    )
    asked.append(text)
    return mcp.types.CreateMessageResult(
        role="assistant",
        content=mcp.types.TextContent(type="text", text=f"sampled for {text}"),
        model="agent-model",
        stopReason="endTurn",
    )


async def on_elicitation(context, params):
    ASKED.setdefault("elicitation", []).append(params.message)
    return mcp.types.ElicitResult(
        action="accept", content={"username": "ada", "email": "ada@example.com"}
    )


ASKED = {}


async def ask_scenario(session, report, protocol):
    report["protocol"] = protocol
    tools = await session.list_tools()
    names = sorted(t.name for t in tools.tools)
    report["tools"] = names
    answers = {}
    for name in names:
        if name.endswith("test_sampling"):
            result = await session.call_tool(name, {"prompt": "the capital of France"})
        elif name.endswith("test_elicitation"):
            result = await session.call_tool(name, {"message": "who are you?"})
        else:
            continue
        answers[name] = text_of(result.content)
    report["answers"] = answers
    report["asked"] = ASKED


async def ask_two(kind, target, report):
    if kind == "stdio":
        target = mcp.StdioServerParameters(command=target[0], args=target[1:])
    else:
        target = target[0]
    async with mcp.Client(
        target, sampling_callback=on_sampling, elicitation_callback=on_elicitation
    ) as client:
        await ask_scenario(client, report, client.protocol_version)


async def ask_one(kind, target, report):
    from mcp import ClientSession

    if kind == "stdio":
        from mcp.client.stdio import StdioServerParameters, stdio_client

        transport = stdio_client(StdioServerParameters(command=target[0], args=target[1:]))
    else:
        from mcp.client.streamable_http import streamablehttp_client

        transport = streamablehttp_client(target[0])
    async with transport as streams:
        read, write = streams[0], streams[1]
        async with ClientSession(
            read, write, sampling_callback=on_sampling, elicitation_callback=on_elicitation
        ) as session:
            init = await session.initialize()
            await ask_scenario(session, report, init.protocolVersion)


def main():
    args = sys.argv[1:]
    asking = args[0] == "ask"
    if asking:
        args = args[1:]
    kind, target = args[0], args[1:]
    report = {"sdk": getattr(mcp, "__version__", None) or ("2" if TWO else "1")}
    if asking:
        run = ask_two if TWO else ask_one
    else:
        run = run_two if TWO else run_one
    try:
        asyncio.run(run(kind, target, report))
    except BaseException:
        report["failure"] = traceback.format_exc()
    print(json.dumps(report))


if __name__ == "__main__":
    main()
