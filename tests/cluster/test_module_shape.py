"""The cluster package stays in modules of one concept each, and finds nothing by name:
its services (the coordinator, the store's backend, the ready store's index, a queue's
log) are typed attributes, not looked up with getattr."""
from __future__ import annotations

import ast
from pathlib import Path

CLUSTER = Path(__file__).resolve().parents[2] / "broker" / "cluster"
# the streams' replica module belongs to the streams work and has its own open item
OTHERS = {"stream_replicas.py"}


def test_no_cluster_module_over_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in CLUSTER.glob("*.py")}
    assert {n: s for n, s in sizes.items() if s > 600} == {}


def test_no_getattr_in_cluster_modules():
    found = []
    for path in sorted(CLUSTER.glob("*.py")):
        if path.name in OTHERS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr"):
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                found.append(f"{path.name}:{node.lineno} __getattr__")
    assert found == []
