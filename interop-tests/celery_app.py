"""Celery app and tasks for test_celery.py.

Imported twice: by the test process (``make_app(...)`` builds a client app with the same
configuration and task names) and by every ``celery -A celery_app worker`` subprocess, which
finds its configuration as JSON in ``$ITEST_CELERY_CONFIG`` (the keyword arguments of
``make_app``) and exposes the resulting app as the module attribute ``app``.

Every name the app puts on the broker derives from ``queue`` (a unique ``itest-…`` name), so
runs against a shared RabbitMQ never see each other's messages:

* task queue ``<queue>`` bound to the direct exchange ``<queue>`` with routing key ``<queue>``
* remote control (revoke): fanout ``<queue>.pidbox`` and direct ``reply.<queue>.pidbox``
  (both auto-delete), per-worker queue ``<node>.<queue>.pidbox`` (auto-delete, x-expires)
* events exchange ``<queue>.ev`` (events are off, so normally never declared)

Tasks that need to prove *that* (and when, where, how often) they ran write one JSON file per
run into ``runs_dir``; the worker processes and the test share nothing else but the broker and
the result backend.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

from celery import Celery

CONFIG_ENV = "ITEST_CELERY_CONFIG"


def write_run(runs_dir: str, tag: str, **extra) -> dict:
    """Record one execution as ``<runs_dir>/<tag>.<random>.json`` (atomically)."""
    rec = {"tag": tag, "time": time.time(), "pid": os.getpid(), **extra}
    path = Path(runs_dir) / f"{tag}.{uuid.uuid4().hex}.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, path)
    return rec


def read_runs(runs_dir: str | Path, pattern: str = "*") -> list[dict]:
    """All run records whose tag matches the glob ``pattern``, oldest first."""
    recs = [json.loads(p.read_text()) for p in Path(runs_dir).glob(f"{pattern}.*.json")]
    return sorted(recs, key=lambda r: r["time"])


def make_app(broker_url: str, queue: str, result_backend: str, **conf) -> Celery:
    """A Celery app on ``broker_url``; ``conf`` adds/overrides settings (the workers' extras)."""
    app = Celery("itest_celery", broker=broker_url, backend=result_backend, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_default_exchange=queue,
        task_default_routing_key=queue,
        control_exchange=queue,
        event_exchange=f"{queue}.ev",
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=3,
        worker_prefetch_multiplier=1,
        worker_send_task_events=False,
        task_send_sent_event=False,
        # the rpc:// backend keeps results in a per-client reply queue; ask it not to make
        # them persistent so nothing outlives the test on a shared broker
        result_persistent=False,
    )
    app.conf.update(conf)

    @app.task(name="itest.add", shared=False)
    def add(x, y):
        return x + y

    @app.task(name="itest.tsum", shared=False)
    def tsum(values):
        return sum(values)

    @app.task(bind=True, name="itest.record", shared=False)
    def record(self, runs_dir, tag):
        """Write a run record and return it (time, pid, worker node, redelivered flag)."""
        info = self.request.delivery_info or {}
        return write_run(
            runs_dir,
            tag,
            task_id=self.request.id,
            hostname=self.request.hostname,
            redelivered=bool(info.get("redelivered")),
        )

    @app.task(bind=True, name="itest.slow", shared=False)
    def slow(self, runs_dir, tag, seconds):
        """Write a run record, then take ``seconds`` (a worker busy while it holds more)."""
        info = self.request.delivery_info or {}
        rec = write_run(runs_dir, tag, task_id=self.request.id, hostname=self.request.hostname,
                        redelivered=bool(info.get("redelivered")))
        time.sleep(seconds)
        return rec

    @app.task(bind=True, name="itest.flaky", max_retries=5, shared=False)
    def flaky(self, runs_dir, tag, fail_times):
        """Fail (retry with countdown=1) ``fail_times`` times, then succeed."""
        rec = write_run(runs_dir, tag, task_id=self.request.id, retries=self.request.retries)
        if self.request.retries < fail_times:
            raise self.retry(countdown=1)
        return {"retries": self.request.retries, "time": rec["time"]}

    return app


_config = os.environ.get(CONFIG_ENV)
if _config:  # inside a `celery -A celery_app worker` subprocess
    app = make_app(**json.loads(_config))
