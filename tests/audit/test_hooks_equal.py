"""Random runs of publish, deliver and ack calls: the C hooks and ``hooks.PyHooks`` leave the
same records (sealed and buffered), return the same positions and seal as often."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.audit import events, hooks, recorder

from .test_hooks_accel import C_HOOKS, _trail

pytestmark = pytest.mark.skipif(C_HOOKS is None, reason="the C hooks are not built")

_props = st.dictionaries(
    st.sampled_from([*sorted(events.TRAIL_PROPS), "delivery_mode", "priority", "x-other"]),
    st.one_of(st.none(), st.integers(-2**70, 2**70), st.text(max_size=8),
              st.dictionaries(st.text(max_size=4), st.integers(), max_size=2)),
    max_size=3)
_ints = st.one_of(st.integers(-10, 300), st.integers(-2**70, 2**70))
_call = st.one_of(
    st.tuples(st.just("pub"), st.integers(0, 2), _ints, _props,
              st.lists(st.sampled_from([0, 1, 2, 4]), max_size=4), st.sampled_from(["routed", "taken"]),
              _ints, st.booleans()),
    st.tuples(st.just("del"), st.integers(0, 2), st.integers(0, 4), _ints,
              st.one_of(st.none(), st.text(max_size=4)), st.booleans(), _ints),
    st.tuples(st.just("ack"), st.integers(0, 2), st.integers(0, 60), st.booleans()),
    st.tuples(st.just("clock"), st.sampled_from([0.0, 1000.5, 2000.25])),
)


def _run(t, calls):
    """Plays ``calls`` on trail ``t``; returns what each returned (times are fixed batch
    times or 0.0, which reads the clock: those are compared loosely)."""
    queues = [NS(name="q0", audit_ctx=("v", "q0"), refused_id=None),
              NS(name="q1", audit_ctx=("v", "q1"), refused_id=3),
              NS(name="q2", audit_ctx=None, refused_id=None),
              NS(name="q3"),
              NS(name="q4", audit_ctx=("v", "q4"), refused_id=None)]
    channels = [NS(vhost="v", number=1), NS(vhost="v", number=2, audit_ctx=("v", "g", "p", 2)),
                NS(vhost="off", number=3, audit_ctx=("off", "g", "p", 3))]
    out, deliveries = [], []
    for call in calls:
        kind = call[0]
        if kind == "clock":
            if call[1]:
                t.clock_start()
                t.now = call[1]
            else:
                t.clock_stop()
        elif kind == "pub":
            _, ch, mid, props, qs, outcome, seq, persistent = call
            msg = NS(id=mid, exchange="x", routing_key="k", properties=props,
                     body=b"b" * (abs(mid) % 50), persistent=persistent)
            out.append(t.published(channels[ch], msg, [queues[i] for i in qs], outcome, seq))
        elif kind == "del":
            _, ch, q, mid, ctag, redelivered, count = call
            entry = NS(message=NS(id=mid), redelivered=redelivered, delivery_count=count)
            pos = t.delivered(channels[ch], ctag, len(deliveries) + 1, queues[q], entry)
            deliveries.append((pos, queues[q], entry, ctag))
            out.append(pos)
        elif deliveries:
            _, ch, i, has_consumer = call
            pos, q, entry, ctag = deliveries[i % len(deliveries)]
            consumer = NS(tag=ctag) if has_consumer else None
            out.append(t.acked(channels[ch], NS(audit_pos=pos, queue=q, entry=entry,
                                                consumer=consumer, tag=i)))
    return out


@pytest.fixture(scope="module", params=["as built", "public API only"])
def c_hooks(request, tmp_path_factory):
    """The built C hooks, and the same source built with ``-DHOOKS_FAST_PATHS=0``: what
    Python versions outside the guarded range compile (no private CPython API)."""
    if request.param == "as built":
        return C_HOOKS
    cc = sysconfig.get_config_var("CC") or "cc"
    if shutil.which(cc.split()[0]) is None:
        pytest.skip("no C compiler")
    src = Path(events.__file__).with_name("_hooks.c")
    out = tmp_path_factory.mktemp("fallback") / ("_hooks" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run([*cc.split(), "-shared", "-fPIC", "-O2", "-DHOOKS_FAST_PATHS=0",
                    "-I" + sysconfig.get_paths()["include"], str(src), "-o", str(out)],
                   check=True, timeout=300)
    spec = importlib.util.spec_from_file_location("hooks_fallback._hooks", out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.LAYOUT == (events.PUBC, events.DELC, events.ACKC, events.DACK, events.WIDTH)
    sys.modules.pop("hooks_fallback._hooks", None)
    return module.Hooks


def _same(a, b):
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        if isinstance(x, float) and x not in (1000.5, 2000.25):  # read from the clock
            assert isinstance(y, float) and abs(x - y) < 60, i
        else:
            assert x == y and type(x) is type(y), (i, x, y)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_call, max_size=40), limit=st.integers(1, 8),
       scope_all=st.booleans(), drop=st.booleans())
def test_c_and_python_hooks_stay_equal(c_hooks, calls, limit, scope_all, drop):
    kw = dict(limit=limit, scope_all=scope_all, drop_at=True if drop else None)
    py, c = _trail(hooks.PyHooks, **kw), _trail(c_hooks, **kw)
    assert _run(py, calls) == _run(c, calls)
    _same(py.sealed + py.buf, c.sealed + c.buf)
    assert (py.base, py.fulls, py.dropped_total) == (c.base, c.fulls, c.dropped_total)


def test_the_environment_chooses_the_hooks_when_a_trail_starts(monkeypatch):
    monkeypatch.setenv("TRIOMQ_AUDIT_PYTHON", "1")
    assert hooks.chosen() is hooks.PyHooks
    assert issubclass(recorder.PyTrail, hooks.PyHooks)
    monkeypatch.delenv("TRIOMQ_AUDIT_PYTHON")
    assert hooks.chosen() is C_HOOKS and issubclass(recorder.CTrail, C_HOOKS)


def test_a_broker_started_under_each_setting_records_on_those_hooks(tmp_path):
    """The conftest's setting reaches a broker made in the test: its trail is built on the
    hooks the setting names (so the parametrised audit tests do test both)."""
    from broker.broker import Broker
    from broker.config import AuditSettings, Config
    for kind, want in (("python", hooks.PyHooks), ("c", C_HOOKS)):
        with pytest.MonkeyPatch.context() as mp:
            if kind == "python":
                mp.setenv("TRIOMQ_AUDIT_PYTHON", "1")
            else:
                mp.delenv("TRIOMQ_AUDIT_PYTHON", raising=False)
            broker = Broker(Config(data_dir=str(tmp_path / kind),
                                   audit=AuditSettings(dir=str(tmp_path / kind / "trail"))))
            assert isinstance(broker.audit, want), kind
