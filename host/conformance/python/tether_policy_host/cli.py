"""``conformance.py COMPONENT [--scenarios DIR] [--settings JSON] [--transcripts DIR]
[--only NAME]... [--cache-dir DIR | --no-cache] [--log]``

Exit status: 0 when every scenario passes, 1 when one fails, 2 when the component cannot be
used (it does not load or instantiate, or it refuses the settings), the settings cannot be
handed to it, or the scenarios cannot be read or are malformed (``malformed scenario NAME: ...``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from .scenarios import MalformedScenario, load_scenarios, run_scenario
from .values import EncodingError

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_SCENARIOS = os.path.join(os.path.dirname(HERE), "scenarios")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="conformance.py",
        description="Run Tether's conformance scenarios against a policy component.",
    )
    parser.add_argument("component", help="the policy component (.wasm)")
    parser.add_argument("--scenarios", default=DEFAULT_SCENARIOS, metavar="DIR",
                        help="the exported scenarios (default: host/conformance/scenarios)")
    parser.add_argument("--settings", default="{}", metavar="JSON",
                        help="settings given to init in every scenario (default: {})")
    parser.add_argument("--transcripts", metavar="DIR", help="write DIR/NAME.jsonl per scenario")
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this scenario (may be repeated)")
    parser.add_argument("--cache-dir", metavar="DIR",
                        help="cache for compiled components (default: ~/.cache/tether/policy-host-python)")
    parser.add_argument("--no-cache", action="store_true", help="compile the component, cache nothing")
    parser.add_argument("--log", action="store_true", help="print the policy's log records to stderr")
    args = parser.parse_args(argv)
    for stream in (sys.stdout, sys.stderr):  # a name or message that is not UTF-8 prints escaped
        try:
            stream.reconfigure(errors="backslashreplace")  # type: ignore[attr-defined]
        except (AttributeError, ValueError):
            pass

    try:
        scenarios = load_scenarios(args.scenarios)
    except MalformedScenario as e:
        print(str(e), file=sys.stderr)
        return 2
    except (OSError, ValueError) as e:
        print("cannot read the scenarios in %s: %s" % (args.scenarios, e), file=sys.stderr)
        return 2
    if args.only:
        known = {s.name for s in scenarios}
        unknown = [n for n in args.only if n not in known]
        if unknown:
            print("no scenario named %s" % ", ".join(unknown), file=sys.stderr)
            return 2
        scenarios = [s for s in scenarios if s.name in args.only]

    from .loader import LoadError, PolicyComponent, PolicyError, PolicyRefused, default_cache_dir

    def log(level: str, message: str) -> None:
        if args.log:
            print("policy %s: %s" % (level, message), file=sys.stderr)

    try:
        cache = None if args.no_cache else (args.cache_dir or default_cache_dir())
        component = PolicyComponent(args.component, log=log, cache_dir=cache)
        first = component.instantiate()
        info = first.info()
    except (LoadError, PolicyError) as e:
        print("cannot use %s: %s" % (args.component, e), file=sys.stderr)
        return 2
    try:
        first.init(args.settings)
    except PolicyRefused as e:
        print("policy %s refused the settings %s: %s" % (first.label, args.settings.strip(), e.message),
              file=sys.stderr)
        return 2
    except PolicyError as e:
        print("cannot use %s: %s" % (args.component, e), file=sys.stderr)
        return 2
    except EncodingError as e:  # e.g. a lone surrogate in the settings
        print("cannot hand the settings to the policy: %s" % e, file=sys.stderr)
        return 2
    del first
    print("checking %s (%s %s, %s, contract %s)"
          % (args.component, info.get("name"), info.get("version"), component.interface, component.contract))

    if args.transcripts:
        os.makedirs(args.transcripts, exist_ok=True)
    passed = failed = 0
    for scenario in scenarios:
        try:
            outcome = run_scenario(scenario, component.instantiate, args.settings)
        except MalformedScenario as e:
            print(str(e), file=sys.stderr)
            return 2
        if not outcome.applicable:
            passed += 1  # as Tether counts it: nothing the component promised failed
            print("n/a  %s (needs contract %s; the policy predates what it checks)" % (outcome.name, scenario.since))
            sys.stdout.flush()
            continue  # and no transcript, as Tether writes none
        if outcome.passed:
            passed += 1
            print("pass %s" % outcome.name)
        else:
            failed += 1
            print("FAIL %s: %s" % (outcome.name, outcome.failure))
        if args.transcripts:
            # scenario.name is index.json's, checked to be [A-Za-z0-9_-]+: no path escapes DIR.
            path = os.path.join(args.transcripts, scenario.name + ".jsonl")
            with open(path, "w", encoding="utf-8", newline="\n") as f:
                f.write("".join(line + "\n" for line in outcome.transcript))
        sys.stdout.flush()
    print("%d passed, %d failed" % (passed, failed))
    return 0 if failed == 0 else 1
