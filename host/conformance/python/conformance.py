#!/usr/bin/env python3
"""Runs Tether's conformance scenarios against a policy component, on wasmtime-py.

    python3 host/conformance/python/conformance.py COMPONENT [--scenarios DIR] [--settings JSON]
                                                 [--transcripts DIR] [--only NAME]...
                                                 [--cache-dir DIR | --no-cache] [--log]

On first use it creates ``host/conformance/python/.venv`` and installs the pinned wasmtime from PyPI
(``requirements.txt``) into it, then re-runs itself there. See README.md.
"""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VENV = os.path.join(HERE, ".venv")
REQUIREMENTS = os.path.join(HERE, "requirements.txt")
#: Written once the pinned requirements are installed; holds what was installed.
MARKER = os.path.join(VENV, ".tether-installed")


def _venv_python() -> str:
    for candidate in (os.path.join(VENV, "bin", "python"), os.path.join(VENV, "Scripts", "python.exe")):
        if os.path.exists(candidate):
            return candidate
    return os.path.join(VENV, "bin", "python")


def _in_venv() -> bool:
    return os.path.realpath(sys.prefix) == os.path.realpath(VENV)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError:
        return ""


def _pinned_here() -> bool:
    """Whether this interpreter already has exactly the pinned requirements (e.g. a CI venv)."""
    try:
        from importlib.metadata import version
    except ImportError:
        return False
    for line in _read(REQUIREMENTS).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, pinned = line.partition("==")
        try:
            if version(name.strip()) != pinned.strip():
                return False
        except Exception:
            return False
    return True


def _bootstrap() -> None:
    if _in_venv() or _pinned_here():
        return
    if not os.path.isfile(REQUIREMENTS):
        print("cannot set up %s: %s is missing" % (VENV, REQUIREMENTS), file=sys.stderr)
        sys.exit(2)
    wanted = _read(REQUIREMENTS)
    pinned = " ".join(line.split("#", 1)[0].strip() for line in wanted.splitlines() if line.split("#", 1)[0].strip())
    step = "creating the directory"
    try:
        os.makedirs(VENV, exist_ok=True)
        with open(os.path.join(VENV, ".tether-lock"), "w") as lock:
            try:
                import fcntl

                fcntl.flock(lock, fcntl.LOCK_EX)  # two first runs at once install once
            except ImportError:
                pass
            if _read(MARKER) != wanted or not os.path.exists(_venv_python()):
                print("setting up %s (%s)" % (VENV, pinned), file=sys.stderr)
                step = "creating the virtual environment"
                subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
                step = "installing %s with pip" % pinned
                try:
                    subprocess.run(
                        [_venv_python(), "-m", "pip", "install", "--disable-pip-version-check", "-q",
                         "--retries", "1", "--timeout", "30", "-r", REQUIREMENTS],
                        check=True,
                    )
                except subprocess.CalledProcessError:
                    print(
                        "cannot set up %s: pip could not install %s (pinned in %s). It needs PyPI, or "
                        "the index PIP_INDEX_URL names, reachable from here, and a wheel of that "
                        "version for this platform and Python %d.%d; pip's own message above says "
                        "which." % (VENV, pinned, REQUIREMENTS, sys.version_info[0], sys.version_info[1]),
                        file=sys.stderr,
                    )
                    sys.exit(2)
                with open(MARKER, "w", encoding="utf-8") as f:
                    f.write(wanted)
    except (OSError, subprocess.CalledProcessError) as e:
        print("cannot set up %s (%s): %s" % (VENV, step, e), file=sys.stderr)
        sys.exit(2)
    python = _venv_python()
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


if __name__ == "__main__":
    _bootstrap()
    sys.path.insert(0, HERE)
    from tether_policy_host.cli import main

    sys.exit(main())
