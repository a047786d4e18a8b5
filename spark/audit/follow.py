"""``python -m spark.audit reconcile --follow STREAM --output DIR``: the reconciliation run
continuously over a trail that the broker appends to a stream (``--audit-stream``).

A Structured Streaming query reads the stream (``spark.streams.source``, the JSON lines
of ``broker/audit/stream_sink.py``) in micro-batches. Each batch's events are written to
``DIR/events/batch=<id>`` (overwritten if Spark runs the batch again after a restart, so
an event is kept once), then ``jobs.reconcile`` runs over every event read so far and one
line says what it found; ``DIR/reconcile.json`` holds the last summary. The query's
checkpoint is ``DIR/checkpoint``: a restarted follower continues after the last batch.
SIGINT (or ``stop``) ends the query between batches' work and returns; the exit status
is the last reconciliation's (1: unaccounted messages, 3: the trail has gaps)."""
from __future__ import annotations

import json
import os
import threading

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from . import jobs
from .source import _TYPES

EVENT_SCHEMA = T.StructType([T.StructField(c, t) for c, t in _TYPES.items()])


def events_of(rows: DataFrame) -> DataFrame:
    """The audit events in a batch of stream rows (one JSON line per event)."""
    lines = rows.select(F.explode(F.split(F.col("body").cast("string"), "\n")).alias("line"))
    return (lines.filter(F.col("line") != "")
            .select(F.from_json("line", EVENT_SCHEMA).alias("e")).select("e.*"))


def line(batch_id: int, summary: dict, n: int) -> str:
    gaps = summary["trail"]["missing_seqs"]
    text = (f"reconcile --follow: batch {batch_id}: {n} events so far; enqueued "
            f"{summary['queues']['enqueued']}, acked {summary['queues']['acked']}; "
            f"unaccounted: {summary['unaccounted']}; still queued at the end: "
            f"{summary['still_queued_at_end']}")
    if gaps:
        text += f"; TRAIL INCOMPLETE: {gaps} sequence number(s) missing"
    return text


def follow(spark: SparkSession, args, stop: threading.Event, emit=print) -> int:
    from spark.streams.source import register
    register(spark)
    out = args.output
    events_dir = os.path.join(out, "events")
    os.makedirs(out, exist_ok=True)
    state = {"status": 0}

    def batch(rows: DataFrame, batch_id: int) -> None:
        events_of(rows).write.mode("overwrite").parquet(
            os.path.join(events_dir, f"batch={batch_id}"))
        ev = spark.read.parquet(events_dir).drop("batch").cache()
        try:
            n = ev.count()
            if n == 0:
                return
            tables, summary = jobs.reconcile(ev, args.window, args.grace)
            for df in tables.values():
                df.unpersist()
        finally:
            ev.unpersist()
        summary["batch"] = batch_id
        summary["events"] = n
        tmp = os.path.join(out, "reconcile.json.tmp")
        with open(tmp, "w") as f:
            json.dump(summary, f, indent=2, default=str)
        os.replace(tmp, os.path.join(out, "reconcile.json"))
        emit(line(batch_id, summary, n))
        for m in summary["unaccounted_messages"][:10]:
            emit(f"  unaccounted: vhost {m['vhost']} queue {m['queue']} msg {m['msg']} "
                 f"message_id={m['message_id']} enqueued at {m['enqueued_at']}, last "
                 f"{m['last_event']}")
        state["status"] = (3 if summary["trail"]["missing_seqs"] else
                           1 if summary["unaccounted"] else 0)

    reader = (spark.readStream.format("triomq-stream")
              .option("host", args.stream_host).option("port", args.stream_port)
              .option("vhost", args.stream_vhost).option("user", args.stream_user)
              .option("password", args.stream_password).option("stream", args.follow)
              .option("startingOffsets", "first"))
    query = (reader.load().writeStream.foreachBatch(batch)
             .option("checkpointLocation", os.path.join(out, "checkpoint"))
             .trigger(processingTime=f"{args.trigger} seconds").start())
    try:
        while query.isActive and not stop.is_set():
            stop.wait(0.5)
    finally:
        query.stop()
    exc = query.exception()
    if exc is not None:
        raise RuntimeError(f"the follow query failed: {exc}")
    return state["status"]
