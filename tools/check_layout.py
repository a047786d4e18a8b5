"""The shape rules of ``broker/`` (``make lint``, through ``tools.check_docs``): no module over
``MAX_LINES`` lines (a bigger one is split by concept, each part with a header saying what it
does not do), no service found with ``getattr(broker, ...)`` / ``getattr(self.broker,
...)`` (services are typed attributes of ``Broker``), and no constructor of a feature
handed its services (``SERVICE_FED``: the core and the features ``services.py`` serves)
that takes the whole broker (a ``broker`` parameter or one annotated ``Broker``), and no
function parameter named ``broker``, ``session``, ``queue`` or ``vhost`` left unannotated
(``ANNOTATED_NAMES``: what a feature is handed shows in its signature). Prints
``file:line: ...`` for each breach and exits 1. Does not judge what the modules contain
otherwise (import-linter holds the layers, ``duplicates`` the copies)."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 600
# modules still over MAX_LINES, each to be split (empty: every module is under it)
KNOWN_LONG: frozenset[str] = frozenset()
CHECK_LINES = True
# lines still probing through the broker, each to become a declared attribute or capability
KNOWN_GETATTR: frozenset[str] = frozenset()
BROKER_GETATTR = re.compile(r"\bgetattr\(\s*(?:self\.)?broker\b")
# Modules (a trailing "/": packages) whose classes get the services they use from the
# composition root (``services.Services``, or their own arguments), never the ``Broker``;
# the protocol listeners (the edge: docs/architecture.md, "Extension points") still take it
# (the cluster's ``install``, a function, is handed it as every feature's is).
SERVICE_FED = ("broker/publishing.py", "broker/services.py", "broker/vhost.py", "broker/routing/",
               "broker/queues/", "broker/exchanges/", "broker/scheduler/", "broker/transactions/",
               "broker/hermes/", "broker/audit/", "broker/policies/", "broker/security/",
               "broker/management/", "broker/cluster/")
# Parameters that always carry their type, wherever they are in broker/ (lambdas aside).
ANNOTATED_NAMES = ("broker", "session", "queue", "vhost")
# "module:function:parameter" still unannotated, each to be annotated (empty: none left)
KNOWN_UNANNOTATED: frozenset[str] = frozenset()


def _takes_broker(arg: ast.arg) -> bool:
    if arg.arg == "broker":
        return True
    if arg.annotation is None:
        return False
    text = ast.unparse(arg.annotation).strip("'\"")
    return re.search(r"(?<![\w.])(?:\w+\.)*Broker\b", text) is not None


def _parse(text: str) -> ast.Module | None:
    try:
        return ast.parse(text)
    except SyntaxError:
        return None


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = fn.args
    return [*args.posonlyargs, *args.args, *args.kwonlyargs]


def broker_constructors(rel: str, text: str) -> list[str]:
    """``rel:line: ...`` for each ``__init__`` in ``text`` (module ``rel``) taking the broker."""
    tree = _parse(text) if rel.startswith(SERVICE_FED) else None
    if tree is None:
        return []
    out = []
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.name != "__init__":
                continue
            for arg in _parameters(fn):
                if _takes_broker(arg):
                    out.append(f"{rel}:{fn.lineno}: {cls.name}() takes the broker ({arg.arg}): "
                               f"hand it the services it uses (broker/services.py)")
    return out


def unannotated_parameters(rel: str, text: str) -> list[str]:
    """``rel:line: ...`` for each parameter named in ``ANNOTATED_NAMES`` left unannotated in
    a function (or method) of ``text`` (module ``rel``)."""
    tree = _parse(text)
    if tree is None:
        return []
    out = []
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for arg in _parameters(fn):
            if (arg.arg in ANNOTATED_NAMES and arg.annotation is None
                    and f"{rel}:{fn.name}:{arg.arg}" not in KNOWN_UNANNOTATED):
                out.append(f"{rel}:{fn.lineno}: {fn.name}() leaves its parameter {arg.arg} "
                           f"unannotated: give it its type")
    return out


def modules() -> list[Path]:
    return sorted(p for p in (ROOT / "broker").rglob("*.py") if "__pycache__" not in p.parts)


def problems(paths: list[Path] | None = None, check_lines: bool | None = None) -> list[str]:
    check_lines = CHECK_LINES if check_lines is None else check_lines
    out = []
    for path in paths if paths is not None else modules():
        rel = path.relative_to(ROOT).as_posix()
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        if check_lines and len(lines) > MAX_LINES and rel not in KNOWN_LONG:
            out.append(f"{rel}:1: {len(lines)} lines, over {MAX_LINES}: split it by concept")
        for n, line in enumerate(lines, 1):
            if BROKER_GETATTR.search(line) and line.strip() not in KNOWN_GETATTR:
                out.append(f"{rel}:{n}: getattr on the broker: declare the service on Broker "
                           f"(or the capability on its class) and read the attribute")
        text = "\n".join(lines)
        out.extend(broker_constructors(rel, text))
        out.extend(unannotated_parameters(rel, text))
    return out


def main() -> int:
    found = problems()
    for p in found:
        print(p)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
