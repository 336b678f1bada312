"""The failure-window policy for Tether, in plain Python (no wasm needed to run or test it)."""

from .core import NAME, VERSION, Policy, PolicyError

__all__ = ["NAME", "VERSION", "Policy", "PolicyError"]
