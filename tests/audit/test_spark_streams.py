"""The reconciliation over a real trail of stream traffic, on a real local Spark: a stream
message read by N consumers counts as delivered to each, records retention removed are
truncated, not lost, and nothing is unaccounted; a version 1 file beside the new ones is
read too."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import threading

import fastavro
import pytest

from broker.audit import events
from broker.audit.reader import VERSION_KEY

from .test_stream_deliveries import run_traffic

pytestmark = [pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs Java 17"),
              pytest.mark.timeout(600)]  # a JVM's start and the jobs on a loaded machine


def _v1_file(trail: str) -> None:
    """A file of an older broker (schema version 1): a queue's publish, delivery and ack."""
    path = os.path.join(os.path.dirname(events.SCHEMA_PATH), "audit_event_v1.avsc")
    with open(path) as f:
        v1 = json.load(f)
    names = [f["name"] for f in v1["fields"]]
    t = 1_700_000_000.0
    evs = [(events.PUB, t, "/", "", "old", 1, {"message_id": "old-1"}, 3, True, "guest", "c",
            1, 1, ["old"], "routed"),
           (events.DEL, t, "/", "old", 1, "ctag", 1, False, 1, "c", 1),
           (events.ACK, t, "/", "old", 1, "ctag", 1, "c", 1)]
    out = os.path.join(trail, "dt=2023-11-14", "hour=22", "node=old")
    os.makedirs(out)
    with open(os.path.join(out, "part-00000000000000000001.avro"), "wb") as f:
        fastavro.writer(f, fastavro.parse_schema(v1),
                        [{k: v for k, v in events.to_record(ev, "old", i).items() if k in names}
                         for i, ev in enumerate(evs, 1)],
                        codec="deflate", metadata={VERSION_KEY: "1"})


class SparkStarting:
    """A local Spark session started in a thread, so that the JVM starts while the traffic
    runs; ``session()`` waits for it (and raises what its start raised)."""

    def __init__(self, name: str):
        self._box: dict = {}
        self._thread = threading.Thread(target=self._start, args=(name,), name="spark-start",
                                        daemon=True)
        self._thread.start()

    def _start(self, name: str) -> None:
        from spark.audit.cli import spark_session
        try:
            self._box["session"] = spark_session("local[2]", name)
        except BaseException as exc:  # re-raised by session()
            self._box["error"] = exc

    def session(self):
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["session"]


def job_args(trail: str) -> argparse.Namespace:
    """The jobs' arguments over the whole of ``trail`` (one window, no grace)."""
    return argparse.Namespace(input=trail, from_us=None, to_us=None, window=60 * 24 * 366 * 5,
                              grace=0.0, producer_key="auto", message_id=None, ref_key=None,
                              msg=None, consumer=None)


def test_reconcile_counts_stream_deliveries_per_consumer(tmp_path):
    from spark.audit.cli import run_job
    starting = SparkStarting("triomq-audit-streams")
    try:
        trail = run_traffic(tmp_path)
        _v1_file(trail)
    finally:
        spark = starting.session()
    try:
        args = job_args(trail)
        result, status = run_job(spark, "reconcile", args, str(tmp_path / "out"))
        args.message_id = "m-4"
        tracked, _ = run_job(spark, "track", args, str(tmp_path / "track"))
    finally:
        spark.stop()
    rec = result["reconcile"]
    assert status == 0 and rec["unaccounted"] == 0, rec["unaccounted_messages"]
    # the old file's queue copy: published, delivered, acked
    assert rec["queues"]["enqueued"] == 1 and rec["queues"]["acked"] == 1
    streams = rec["streams"]
    # st: 7 records, each to its 3 consumers (rstream, rbfly, pika); sb: 3 to one, then the
    # stream deleted; short: 60 appended, the oldest removed by retention, none read
    assert (streams["appended"], streams["delivered"], streams["deliveries"]) == (70, 10, 24)
    assert streams["truncated"] > 0 and streams["deleted"] == 3  # sb's, with the stream
    assert streams["truncated"] + streams["deleted"] + streams["in_stream_at_end"] == 70
    per = sorted((c["queue"], c["delivered"], c["first_offset"], c["last_offset"])
                 for c in streams["consumers"])
    assert per == [("sb", 3, 0, 2)] + [("st", 7, 0, 6)] * 3
    # one message's history: its publish, its offset, each consumer's delivery of it (a
    # range holding offset 4), the AMQP 0-9-1 consumer's ack
    history = tracked["track"]["history"]
    assert sorted(h["event"] for h in history) == [
        "acked", "appended", "delivered", "delivered", "delivered", "published"]
    assert len({h["msg"] for h in history}) == 1
    assert all(h["stream_offset"] <= 4 < h["stream_offset"] + (h["stream_count"] or 1)
               for h in history if h["event"] in ("appended", "delivered", "acked"))
    assert "pika-reader" in {h["consumer_tag"] for h in history if h["event"] == "delivered"}
