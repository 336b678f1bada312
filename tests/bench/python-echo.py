"""Issue 24's own measurement: the official Python SDK client timing `echo` on a stdio server
(@modelcontextprotocol/server-everything in the issue) directly, through socat (one more process,
no parsing: the floor) and through `tether serve`. The sessions are open at once and take turns
call by call, the order rotating each call, so that what the machine does meanwhile falls on
every path and no path always follows the same neighbour.

Besides the latencies it reports the CPU time each process in a path spent a call: the kernel's
run time of each of its threads (/proc/PID/task/TID/schedstat, nanoseconds) over the window of
the measured calls (every path's calls run in it), less what the process spends idle (measured
for a second before, with no calls), divided by the path's calls.

Run by tests/bench/python-echo.sh, which installs what it needs.
Usage: python python-echo.py TETHER [--calls N] [--rounds N] [--also LABEL=TETHER]... -- SERVER_COMMAND [ARGS...]
"""

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from contextlib import AsyncExitStack

import mcp
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client

# A relay's added p50 below this is noise: a ratio to it says nothing.
RATIO_FLOOR_US = 5.0


def children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    # The command may hold spaces and parentheses: the fields follow the last ')'.
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


def descendants(pid: int) -> list[int]:
    found = children(pid)
    for child in list(found):
        found += descendants(child)
    return found


def thread_times(pid: int) -> dict[tuple[int, str], int]:
    """CPU nanoseconds of each thread the process has now."""
    times = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                times[(pid, tid)] = int(f.read().split()[0])
        except OSError:
            pass
    return times


class Snapshot:
    """Per-thread CPU of the process a path starts (with helpers running the same program, such
    as Tether's guard) and of the server behind it."""

    def __init__(self, front: int):
        exe = os.readlink(f"/proc/{front}/exe")
        self.front, self.behind = thread_times(front), {}
        self.at = time.perf_counter()
        for pid in descendants(front):
            try:
                own = os.readlink(f"/proc/{pid}/exe") == exe
                (self.front if own else self.behind).update(thread_times(pid))
            except OSError:
                pass

    def since(self, earlier: "Snapshot") -> tuple[float, float, float]:
        """Seconds and CPU seconds (front, behind) since `earlier`. A thread that ended between
        the two is left out (its time in between is unknown); a new one counts from zero."""

        def delta(now: dict, before: dict) -> float:
            return sum(ns - before.get(key, 0) for key, ns in now.items()) / 1e9

        return self.at - earlier.at, delta(self.front, earlier.front), delta(self.behind, earlier.behind)


async def open_session(stack: AsyncExitStack, params: StdioServerParameters):
    if hasattr(mcp, "Client"):  # SDK 2.x
        session = await stack.enter_async_context(mcp.Client(params))
    else:
        read, write = await stack.enter_async_context(stdio_client(params))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
    # Tether answers before its server is up and announces the tools when they are.
    for _ in range(200):
        tools = await session.list_tools()
        if any(t.name == "echo" for t in tools.tools):
            return session
        await asyncio.sleep(0.05)
    raise AssertionError(f"no echo tool: {[t.name for t in tools.tools]}")


async def timed_echo(session, argument: str, i: int) -> float:
    start = time.perf_counter()
    result = await session.call_tool("echo", {argument: f"hello {i}"})
    elapsed = time.perf_counter() - start
    assert not (result.isError if hasattr(result, "isError") else result.is_error), result
    return elapsed * 1e6


async def one_round(
    paths: dict[str, StdioServerParameters], argument: str, calls: int, warmup: int
) -> tuple[dict[str, list[float]], dict[str, tuple[float, float]]]:
    """Times `calls` echo calls on each path, the paths taking turns call by call. Returns the
    times and, for each path, the CPU µs a call of the process the client started (Tether,
    socat, the server) and of the server behind it (none when direct)."""
    async with AsyncExitStack() as stack:
        before_open = set(children(os.getpid()))
        sessions, processes = {}, {}
        for name, params in paths.items():
            sessions[name] = await open_session(stack, params)
            (front,) = set(children(os.getpid())) - before_open - set(processes.values())
            processes[name] = front
        names = list(paths)
        times: dict[str, list[float]] = {name: [] for name in names}
        for i in range(warmup):
            for name in names:
                await timed_echo(sessions[name], argument, i)
        # What each process spends with no calls (timers, keepalives), to take out of the window.
        idle_start = {name: Snapshot(front) for name, front in processes.items()}
        await asyncio.sleep(1.0)
        start = {name: Snapshot(front) for name, front in processes.items()}
        for i in range(calls):
            turn = i % len(names)
            for name in names[turn:] + names[:turn]:
                times[name].append(await timed_echo(sessions[name], argument, warmup + i))
        cpu = {}
        for name, front in processes.items():
            idle_secs, idle_front, idle_behind = start[name].since(idle_start[name])
            secs, busy_front, busy_behind = Snapshot(front).since(start[name])

            def per_call_us(busy: float, idle: float) -> float:
                return max(0.0, busy - idle / idle_secs * secs) / calls * 1e6

            cpu[name] = (per_call_us(busy_front, idle_front), per_call_us(busy_behind, idle_behind))
        return times, cpu


def mcp_version() -> str:
    from importlib.metadata import version

    return version("mcp")


def quantile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tether")
    parser.add_argument("server", nargs="+", help="the stdio server's command and arguments")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="LABEL=TETHER",
        help="another build of the gateway, measured in the same rounds (repeatable)",
    )
    parser.add_argument("--echo-argument", default="message", help="`echo`'s argument (Tether's fixture: text)")
    args = parser.parse_args()
    # socat's EXEC: address splits its command on spaces and gives ':', ',' and '!' meanings.
    if any(c in part for part in args.server for c in " :,!"):
        parser.error("the server's command and arguments may not hold spaces, ':', ',' or '!' (socat's EXEC:)")

    with tempfile.TemporaryDirectory(prefix="tether-python-echo-") as work:
        config = os.path.join(work, "servers.json")
        with open(config, "w") as f:
            # `prefix: ""`: the agent sees the server's own names, as it does directly.
            server = {"command": args.server[0], "args": args.server[1:], "prefix": ""}
            json.dump({"mcpServers": {"everything": server}}, f)
        env = dict(os.environ)

        def gateway(label: str, binary: str) -> StdioServerParameters:
            state = os.path.join(work, f"state-{label}.json")
            return StdioServerParameters(
                command=binary, args=["serve", "--config", config, "-qq", "--state-file", state], env=env
            )

        paths = {
            "direct": StdioServerParameters(command=args.server[0], args=args.server[1:], env=env),
            "socat": StdioServerParameters(command="socat", args=["STDIO", "EXEC:" + " ".join(args.server)], env=env),
            "tether": gateway("tether", args.tether),
        }
        for also in args.also:
            label, _, binary = also.partition("=")
            if not binary or label in paths:
                parser.error(f"--also {also}: give LABEL=PATH with a label other than {', '.join(paths)}")
            paths[label] = gateway(label, binary)
        gateways = list(paths)[2:]

        p50s: dict[str, list[float]] = {name: [] for name in paths}
        p99s: dict[str, list[float]] = {name: [] for name in paths}
        cpus: dict[str, list[tuple[float, float]]] = {name: [] for name in paths}
        for round_no in range(args.rounds):
            times, cpu = await one_round(paths, args.echo_argument, args.calls, args.warmup)
            for name in paths:
                p50s[name].append(quantile(times[name], 0.5))
                p99s[name].append(quantile(times[name], 0.99))
                cpus[name].append(cpu[name])
            direct = p50s["direct"][-1]
            added = ", ".join(f"{name} {p50s[name][-1] - direct:+.0f} µs" for name in ["socat", *gateways])
            spent = ", ".join(f"{name} {cpu[name][0]:.0f} / {cpu[name][1]:.0f} µs" for name in ["socat", *gateways])
            print(
                f"round {round_no + 1}: direct p50 {direct:.0f} µs; added p50: {added}; CPU a call, in the "
                f"path / server: direct — / {cpu['direct'][0]:.0f} µs, {spent}",
                flush=True,
            )

    print()
    print(f"Python SDK {mcp_version()}, {args.calls} calls a round after {args.warmup} unmeasured, {args.rounds} rounds")
    print(
        "| path | p50 (median of rounds) | added p50 over direct, each round | p99 (median) "
        "| CPU a call, in the path / server (medians) |"
    )
    print("|---|---|---|---|---|")
    for name in paths:
        added = [p - d for p, d in zip(p50s[name], p50s["direct"])]
        added_text = "—" if name == "direct" else ", ".join(f"{a:+.0f}" for a in added) + " µs"
        front = statistics.median(c[0] for c in cpus[name])
        behind = statistics.median(c[1] for c in cpus[name])
        cpu_text = f"— / {front:.0f} µs" if name == "direct" else f"{front:.0f} / {behind:.0f} µs"
        print(
            f"| {name} | {statistics.median(p50s[name]):.0f} µs | {added_text} | "
            f"{statistics.median(p99s[name]):.0f} µs | {cpu_text} |"
        )
    print()
    for name in gateways:
        ratios = [
            f"{(t - d) / (s - d):.1f}×" if s - d >= RATIO_FLOOR_US else "n/a (socat adds under 5 µs)"
            for t, s, d in zip(p50s[name], p50s["socat"], p50s["direct"])
        ]
        print(f"{name}'s added p50 / socat's, each round: " + ", ".join(ratios))


if __name__ == "__main__":
    asyncio.run(main())
