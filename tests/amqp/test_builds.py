"""Which build of the AMQP codec runs (broker/amqp/builds.py): TRIOMQ_PURE=1 forces the
pure-Python modules, the compiled ones run otherwise when `make setup` built them, and the
start-up log and /metrics name the build running."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.amqp import builds

ROOT = Path(__file__).resolve().parents[2]


def _in_subprocess(env_pure: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRIOMQ_PURE"}
    if env_pure is not None:
        env["TRIOMQ_PURE"] = env_pure
    code = ("import broker.amqp.codec as c, broker.amqp.connection as n; from broker.amqp import builds; "
            "print(builds.current(), c.__file__.endswith('.py'), n.__file__.endswith('.py'), "
            "builds.describe(), sep='|')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=str(ROOT))
    return out.stdout.strip().split("|")


def test_triomq_pure_forces_the_source_modules():
    pure = _in_subprocess("1")
    assert pure[:3] == ["pure", "True", "True"]
    assert "TRIOMQ_PURE" in pure[3]


@pytest.mark.skipif(any(builds.extension(m) is None for m in builds.COMPILED),
                    reason="no compiled modules here (built by make setup with a C compiler)")
def test_the_compiled_modules_run_by_default():
    assert _in_subprocess(None)[:3] == ["compiled", "False", "False"]
    assert _in_subprocess("0")[:3] == ["compiled", "False", "False"]


def test_metrics_name_the_running_build():
    from broker.management.metrics_families import identity

    codec_family = [f for f in identity() if f.name == "triomq_amqp_codec_info"]
    assert [s.labels for s in codec_family[0].samples] == [{"build": builds.current()}]
    if builds.pure_forced():
        assert builds.current() == "pure"
