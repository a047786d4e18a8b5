"""Rounds of load + fault + recovery on a shared-store cluster, then one check."""
from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

from . import workload
from .checker import check, percentile
from .db import PgDatabase
from .nemesis import NEMESES
from .nodes import SharedStoreCluster
from .workload import Consumer, History, Producer

log = logging.getLogger("jepsen")


def run(rounds: int = 2, nemeses: tuple[str, ...] = ("kill9", "sigstop"), nodes: int = 2,
        producers: int = 3, consumers: int = 2, queues: int = 2, pause: float = 5.0,
        warmup: float = 1.5, lease: float = 3.0, renew: float = 0.5, timeout: float = 1.5,
        workdir: Path | None = None, pg_host: str = "127.0.0.1", pg_port: int = 5432) -> dict:
    """Run ``rounds`` faults (cycling through ``nemeses``) under confirmed load; returns
    the checker's verdict plus each round's failover times."""
    keep = workdir is not None
    work = Path(workdir or tempfile.mkdtemp(prefix="triomq-jepsen-"))
    db = PgDatabase(pg_host, pg_port)
    sql_args = ["--sql-lease", str(lease), "--sql-renew", str(renew), "--sql-timeout", str(timeout)]
    cluster = SharedStoreCluster(db.url, work, nodes, sql_args)
    history = History()
    names = [f"jepsen-q{i}" for i in range(queues)]
    clients: list = []
    faults: list[dict] = []
    try:
        cluster.start()
        clients = ([Producer(i, cluster.addresses, names, history) for i in range(producers)]
                   + [Consumer(i, cluster.addresses, names, history) for i in range(consumers)])
        for c in clients:
            c.start()
        for r in range(rounds):
            nemesis = NEMESES[nemeses[r % len(nemeses)]](pause)
            cluster.wait_standbys(120)
            time.sleep(warmup)
            old = cluster.wait_master(30)
            t_fault = time.monotonic()
            nemesis.inject(old)
            new = cluster.wait_master(lease + 30, exclude=old)
            t_serving = time.monotonic()
            deadline = t_serving + 30
            gap = history.confirm_gap(t_fault, t_serving)
            while gap is None and time.monotonic() < deadline:
                time.sleep(0.05)
                gap = history.confirm_gap(t_fault, t_serving)
            nemesis.end(old)
            # a paused master, resumed after a standby took over, must find the lease taken
            # and stop (it never confirms again); the checker would see it if it did not
            deposed_exit = cluster.wait_exit(old, 30.0) if old.alive else 0.0
            cluster.heal()
            fault = {"round": r + 1, "nemesis": nemesis.name, "old": old.name, "new": new.name,
                     "deposed_exit_s": round(deposed_exit, 3) if deposed_exit is not None else None,
                     "takeover_s": round(t_serving - t_fault, 3),
                     "confirm_gap_s": round(gap[0], 3) if gap else None,
                     "confirms_resumed_s": round(gap[1], 3) if gap else None}
            faults.append(fault)
            log.info("round %d: %s", r + 1, fault)
        time.sleep(warmup)
        workload.finish(clients, history, idle=3.0)
    finally:
        workload.stop(clients)
        cluster.stop()
        try:
            db.drop()
        except Exception:  # the verdict matters more than the clean-up
            log.warning("could not drop database %s", db.name)
    result = check(history)
    result["ok"] = result["ok"] and all(f["deposed_exit_s"] is not None for f in faults)
    if result["ok"] and not keep:
        shutil.rmtree(work, ignore_errors=True)  # logs are kept when something was wrong
    takeovers = [f["takeover_s"] for f in faults]
    resumed = [f["confirms_resumed_s"] for f in faults if f["confirms_resumed_s"] is not None]
    gaps = [f["confirm_gap_s"] for f in faults if f["confirm_gap_s"] is not None]
    result.update({
        "rounds": len(faults), "faults": faults, "workdir": str(work),
        "takeover_p50_s": percentile(takeovers, 50), "takeover_p99_s": percentile(takeovers, 99),
        "confirms_resumed_p50_s": percentile(resumed, 50),
        "confirms_resumed_p99_s": percentile(resumed, 99),
        "confirm_gap_p50_s": percentile(gaps, 50), "confirm_gap_p99_s": percentile(gaps, 99),
        "confirms_never_resumed": len(faults) - len(resumed),
        "deposed_kept_running": sum(f["deposed_exit_s"] is None for f in faults),
    })
    return result
