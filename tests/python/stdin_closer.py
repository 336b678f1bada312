"""A stdio MCP server that closes its stdin on its first tool call and lives on.

Answers that call, then keeps running with stdout open, so the next request written to it
fails with a broken pipe: a call that provably never left. Each call it runs is appended to
the log file given as its argument (`pid arguments-as-json`). Plain Python, no SDK: the point is
a pipe closed at a precise moment, which a threaded reader cannot do.
"""

import json
import os
import sys
import time

log_path = sys.argv[1]


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def answer(request, result):
    send({"jsonrpc": "2.0", "id": request["id"], "result": result})


TOOL = {
    "name": "record",
    "description": "Records its arguments.",
    "inputSchema": {"type": "object"},
}

for line in sys.stdin:
    request = json.loads(line)
    method = request.get("method")
    if "id" not in request:
        continue
    if method == "initialize":
        answer(
            request,
            {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "stdin-closer", "version": "1"},
            },
        )
    elif method == "tools/list":
        answer(request, {"tools": [TOOL]})
    elif method == "tools/call":
        arguments = request["params"].get("arguments")
        with open(log_path, "a") as log:
            log.write(f"{os.getpid()} {json.dumps(arguments, sort_keys=True)}\n")
        # Closed before the answer goes out: whatever is written after it finds no reader.
        os.close(0)
        answer(request, {"content": [{"type": "text", "text": json.dumps(arguments, sort_keys=True)}]})
        break
    elif method == "ping":
        answer(request, {})
    else:
        send(
            {
                "jsonrpc": "2.0",
                "id": request["id"],
                "error": {"code": -32601, "message": f"unknown method {method}"},
            }
        )

while True:
    time.sleep(3600)
