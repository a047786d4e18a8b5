"""Per-call cost of the audit hooks, C against Python (``python -m bench.audit_hooks_percall``).

A 4,096-event buffer, calls inside a receive batch (``now`` set), objects with ``__slots__``
like the broker's message, entry and unacked item; the buffer is cleared when full (not
sealed), so the figure is the hook alone. Best of 25 runs of ``timeit``. ``--public-api``
also builds ``_hooks.c`` with ``-DHOOKS_FAST_PATHS=0`` (what Python versions outside the
guarded range compile) and measures it."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
import tempfile
import timeit
from pathlib import Path

from broker.audit import events, hooks


class Msg:
    __slots__ = ("body", "exchange", "id", "persistent", "properties", "routing_key")

    def __init__(self, i):
        self.id, self.exchange, self.routing_key = i, "x", "k"
        self.properties, self.body, self.persistent = {"delivery_mode": 2}, b"b" * 100, True


class Entry:
    __slots__ = ("delivery_count", "message", "redelivered")

    def __init__(self, m):
        self.message, self.redelivered, self.delivery_count = m, False, 0


class Item:
    __slots__ = ("audit_pos", "consumer", "entry", "queue", "tag")


class Q:
    __slots__ = ("audit_ctx", "name", "refused_id")

    def __init__(self):
        self.name, self.audit_ctx, self.refused_id = "q", ("v", "q"), None


class Ch:
    __slots__ = ("audit_ctx",)

    def __init__(self):
        self.audit_ctx = ("v", "guest", "peer", 1)


def trail(base):
    class T(base):  # type: ignore[misc, valid-type]
        def __init__(self):
            self.buf, self.base, self.limit, self.now = [], 0, 4096 * events.WIDTH, 1000.5
            self._scope_all, self._vhosts_on, self.dropped_total = True, {}, 0

        def _full(self):
            self.base += len(self.buf)
            self.buf = []
    return T()


def measure(base, n=50_000) -> dict[str, float]:
    t, ch, q, m = trail(base), Ch(), Q(), Msg(12345)
    e, qs, c = Entry(m), [q], type("C", (), {"tag": "ctag"})()
    out = {}
    out["published"] = min(timeit.repeat(lambda: t.published(ch, m, qs, "routed", 7),
                                         number=n, repeat=25)) / n * 1e9

    out["delivered"] = min(timeit.repeat(lambda: t.delivered(ch, "ctag", 9, q, e),
                                         number=n, repeat=25)) / n * 1e9

    def ack():  # a delivery then its ack, folded into the delivery's record
        it = Item()
        it.audit_pos, it.queue, it.entry, it.consumer, it.tag = (
            t.delivered(ch, "ctag", 9, q, e), q, e, c, 9)
        t.acked(ch, it)
    both = min(timeit.repeat(ack, number=n, repeat=25)) / n * 1e9
    out["delivered+acked (folded)"] = both
    return out


def public_api_build(tmp: str) -> type:
    cc = (sysconfig.get_config_var("CC") or "cc").split()
    out = Path(tmp) / ("_hooks" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([*cc, "-shared", "-fPIC", "-O2", "-DHOOKS_FAST_PATHS=0",
                    "-I" + sysconfig.get_paths()["include"],
                    str(Path(events.__file__).with_name("_hooks.c")), "-o", str(out)],
                   check=True, timeout=300)
    spec = importlib.util.spec_from_file_location("hooks_public._hooks", out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Hooks


def main() -> None:
    kinds = [("python", hooks.PyHooks)]
    if hooks.CHooks is not hooks.PyHooks:
        kinds.insert(0, ("c", hooks.CHooks))
    tmp = tempfile.TemporaryDirectory()
    if "--public-api" in sys.argv:
        kinds.insert(1, ("c, public API only", public_api_build(tmp.name)))
    for name, base in kinds:
        print(name, ", ".join(f"{k} {v:.0f} ns" for k, v in measure(base).items()))


if __name__ == "__main__":
    main()
