"""A Python host for Tether policy components (contract ``tether:policy@0.2.x``).

    from tether_policy_host import PolicyHost
    policy = PolicyHost("policy.wasm").init("{}")
    actions = policy.handle({"now": 1000, "kind": {"tag": "server-configured", "val": {...}}})

Values are the JSON encoding of docs/CONFORMANCE.md. The loader needs wasmtime (pinned in
requirements.txt); ``values`` and ``scenarios`` are pure Python.
"""

__all__ = [
    "PolicyHost",
    "PolicyComponent",
    "PolicyInstance",
    "PolicyError",
    "PolicyRefused",
    "PolicyTrap",
    "LoadError",
]


def __getattr__(name):  # lazy: the pure modules import without wasmtime
    if name in __all__:
        from . import loader

        return getattr(loader, name)
    raise AttributeError(name)
