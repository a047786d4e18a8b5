"""malloc tuning for large message bodies: freed heap is kept and reused (up to the broker's
``free_heap_kept``) instead of being given back on every free and faulted in again.

Counted in page faults (getrusage), in a fresh interpreter so that the tuning of this one
does not matter: no timing."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from broker import malloc

REPO_ROOT = Path(__file__).resolve().parents[1]

SCRIPT = """
import resource, sys
from broker.malloc import keep_free_heap
if sys.argv[1] == "keep":
    assert keep_free_heap(32 << 20)

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def burst():  # four 1 MiB bodies received, delivered and dropped
    bodies = [bytearray(1 << 20) for _ in range(4)]
    del bodies

burst()
before = faults()
for _ in range(20):
    burst()
print((faults() - before) / 20)
"""


def _faults_per_burst(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], cwd=str(REPO_ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


@pytest.mark.skipif(malloc._mallopt is None, reason="glibc's mallopt only")
def test_large_bodies_reuse_the_freed_heap_without_page_faults():
    # 4 MiB in 4 KiB pages is 1,024 faults when the pages go back after each burst
    assert _faults_per_burst("default") > 500  # what the defaults do (the reason for it)
    assert _faults_per_burst("keep") < 16
