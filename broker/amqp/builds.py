"""Which build of the AMQP codec runs: compiled or pure.

``make setup`` compiles the hot modules below with Cython from these same ``.py`` files into
extension modules beside them (``codec.cpython-311-….so``); Python's import system prefers
an extension module to a source file of the same name, so the compiled build runs whenever
it is there. The ``.py`` files stay the reference (``tests/amqp/test_compiled_equivalence.py``
holds both builds' outputs equal). The source runs instead:

- with ``TRIOMQ_PURE=1`` in the environment (CI runs the codec's tests so),
- where no compiler built the extensions (a machine without one runs, slower),
- for a module whose source is newer than its extension (edited since ``make setup``).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Final

# The modules compiled (setup.py reads this list): the frame split, method and property
# codecs, the connection state machine around them and the output frames.
COMPILED: Final = ("fields", "spec", "codec", "output", "connection")
PACKAGE: Final = __name__.rpartition(".")[0]
_HERE: Final = Path(__file__).parent
_EXT_SUFFIXES: Final = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def pure_forced() -> bool:
    return os.environ.get("TRIOMQ_PURE", "") not in ("", "0")


def extension(module: str) -> Path | None:
    for suffix in _EXT_SUFFIXES:
        path = _HERE / (module + suffix)
        if path.exists():
            return path
    return None


def _stale(module: str, ext: Path) -> bool:
    return (_HERE / (module + ".py")).stat().st_mtime > ext.stat().st_mtime


class _SourceFinder(importlib.abc.MetaPathFinder):
    """Loads the listed modules of the package from their ``.py`` files."""

    def __init__(self, modules: set[str]) -> None:
        self.modules = modules

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        package, _, module = fullname.rpartition(".")
        if package != PACKAGE or module not in self.modules:
            return None
        return importlib.util.spec_from_file_location(fullname, _HERE / (module + ".py"))


def _choose() -> set[str]:
    """The compiled modules that will load from source; installs the finder for them."""
    if pure_forced():
        source = set(COMPILED)
    else:
        source = set()
        for module in COMPILED:
            ext = extension(module)
            if ext is None or _stale(module, ext):
                source.add(module)
    if source and len(source) < len(COMPILED):
        source = set(COMPILED)  # never a mix: one build or the other
    if source:
        sys.meta_path.insert(0, _SourceFinder(source))
    return source


_SOURCE: Final = _choose()


def current() -> str:
    """"compiled" or "pure": what this process runs (for the log, /api/overview, /metrics)."""
    if _SOURCE:
        return "pure"
    return "compiled"


def describe() -> str:
    """One line for the start-up log."""
    if not _SOURCE:
        return "AMQP codec: compiled build (Cython extension modules)"
    if pure_forced():
        return "AMQP codec: pure-Python build (TRIOMQ_PURE is set)"
    missing = [m for m in COMPILED if extension(m) is None]
    if missing:
        return "AMQP codec: pure-Python build (no compiled modules: make setup builds them with a C compiler)"
    return "AMQP codec: pure-Python build (the compiled modules are older than their source: run make setup)"
