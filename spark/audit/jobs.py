"""The audit jobs over the trail's events (a DataFrame with ``source.COLUMNS``).

Each job returns ``(tables, summary)``: named DataFrames (written as Parquet by the CLI) and
a JSON-able dict. Times in the trail are microseconds since the epoch (UTC).

A *queue copy* is one message in one queue: ``(node, vhost, queue, msg)``. It enters with
``enqueued`` (for a client's publish: listed in the ``published`` event's ``queues``) and
leaves with one final event: ``acked``, ``settled`` (no-ack delivery, rejected without a
dead-letter exchange: ``reason`` rejected), ``dropped`` (max-length), ``expired``,
``dead_lettered``, ``purged`` or ``deleted``.

A *stream copy* is one message in one stream: it is named by its offset (the ``appended``
event maps ``msg`` to ``stream_offset``), it never leaves by a consumer's doing, and any
number of consumers read it: a ``delivered`` event from a stream names a range of offsets
(``stream_offset``, ``stream_count``: a chunk sent to a Stream-protocol subscription, or one
record to an AMQP 0-9-1 consumer), and a ``truncated`` event the range retention (or the
stream's deletion) removed. A stream copy is delivered to every consumer whose ranges hold
its offset; it ends ``truncated`` (not lost) or is still in the stream. Stream copies are not
queue copies; a publish that lists a stream without an ``appended`` record of it stays a
queue copy without a final state: unaccounted.
"""
from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from broker.audit.events import FORWARDED

FINAL = ("acked", "settled", "dropped", "expired", "dead_lettered", "purged", "deleted")
# The trail's columns each job reads: decoding and caching a column costs time per event.
_COPIES = ("node", "vhost", "queue", "msg", "ts_us", "seq", "event", "reason", "queues",
           "stream_offset")
_STREAMS = ("stream_count", "consumer_tag", "connection", "detail")
_IDS = ("message_id", "ref_key", "routing_key")
COLUMNS = {
    "reconcile": _COPIES + _IDS + _STREAMS + ("outcome", "persistent", "count"),
    "sequence": _COPIES + _IDS + ("producer", "producer_seq", "app_id"),
    "latency": (*_COPIES, "due_us"),
    "deadletters": _COPIES + _IDS + ("target",),
    "track": ("seq", "node", "event", "vhost", "queue", "exchange", "routing_key", "msg",
              "message_id", "ref_key", "consumer_tag", "delivery_tag", "redelivered",
              "delivery_count", "requeue", "reason", "target", "outcome", "queues",
              "connection", "user", "ts_us", "stream_offset", "stream_count"),
}
HOUR_US = 3_600_000_000


def _sorted(df: DataFrame, *cols) -> DataFrame:
    """``df`` (a small result) sorted in one partition: no sampling job, as orderBy's range
    partitioning would run for each table."""
    return df.repartition(1).sortWithinPartitions(*cols)


def _rows(df: DataFrame, limit: int | None = None) -> list[dict]:
    rows = df.limit(limit).collect() if limit else df.collect()
    return [r.asDict(recursive=True) for r in rows]


def _iso(col):
    return F.date_format(F.timestamp_micros(col), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'")


def _hour(col):
    return F.date_format(F.timestamp_micros(F.floor(col / HOUR_US) * HOUR_US),
                         "yyyy-MM-dd'T'HH:00'Z'")


# latency buckets, seconds: the narrowest giving at most MAX_BUCKETS over the range
BUCKETS = (1, 10, 60, 300, 900, 3600, 6 * 3600, 86400)
MAX_BUCKETS = 60


def bucket_seconds(first_us: int | None, last_us: int | None) -> int:
    """The bucket width for a range: a short run gets seconds, a day hours."""
    if first_us is None or last_us is None:
        return 3600
    span = max(0, last_us - first_us) / 1e6
    for width in BUCKETS:
        if span / width <= MAX_BUCKETS:
            return width
    return BUCKETS[-1]


def _bucket(col, width_s: int):
    us = width_s * 1_000_000
    return F.date_format(F.timestamp_micros(F.floor(col / us) * us), "yyyy-MM-dd'T'HH:mm:ss'Z'")


def queue_copies(ev: DataFrame) -> DataFrame:
    """One row per queue copy with its enqueue, first delivery, ack and final state."""
    listed = (ev.filter(F.col("event") == "published")
              .select("node", "vhost", F.explode("queues").alias("queue"), "msg", "ts_us",
                      "seq", F.lit("enqueued").alias("event"),
                      F.lit(None).cast("string").alias("reason")))
    own = (ev.filter(F.col("queue").isNotNull() & F.col("stream_offset").isNull())
           .select("node", "vhost", "queue", "msg", "ts_us", "seq", "event", "reason"))
    e = F.col("event")
    final = e.isin(*FINAL)
    located = (ev.filter(e == "appended").select("node", "vhost", "queue", "msg"))
    return (own.unionByName(listed)
            .join(located, ["node", "vhost", "queue", "msg"], "left_anti")
            .groupBy("node", "vhost", "queue", "msg").agg(
        F.min(F.when(e == "enqueued", F.col("ts_us"))).alias("enq_ts"),
        F.min("ts_us").alias("first_ts"),
        F.min(F.when(e == "delivered", F.col("ts_us"))).alias("first_delivery_ts"),
        F.min(F.when(e == "acked", F.col("ts_us"))).alias("ack_ts"),
        F.sum(F.when(e == "delivered", 1).otherwise(0)).alias("deliveries"),
        F.sum(F.when(e == "acked", 1).otherwise(0)).alias("acks"),
        F.max_by(F.when(final, e), F.when(final, F.col("seq"))).alias("final"),
        F.max_by(F.when(final, F.col("reason")), F.when(final, F.col("seq"))).alias("final_reason"),
        F.max(F.when(final, F.col("ts_us"))).alias("final_ts"),
        F.max_by(e, F.col("seq")).alias("last_event"),
        F.max("ts_us").alias("last_ts")))


def _message_ids(ev: DataFrame) -> DataFrame:
    """(node, msg) -> message_id, ref_key, routing_key of publishes, firings and copies."""
    return (ev.filter(F.col("event").isin("published", "fired", "enqueued", "scheduled"))
            .groupBy("node", "msg").agg(F.first("message_id", ignorenulls=True).alias("message_id"),
                                        F.first("ref_key", ignorenulls=True).alias("ref_key"),
                                        F.first("routing_key", ignorenulls=True).alias("routing_key")))


def trail_integrity(ev: DataFrame, seq_counts: dict | None = None) -> tuple[DataFrame, dict]:
    """Per node: the sequence's range, holes, and runs that did not stop cleanly.

    ``seq_counts``: each node's number of distinct sequence numbers when the reader knows
    it (``Trail.seq_counts``: from the blocks' runs), which spares a distinct count of
    every event."""
    counted = F.countDistinct("seq") if seq_counts is None else F.count(F.lit(1))
    per_node = ev.groupBy("node").agg(
        F.min("seq").alias("first_seq"), F.max("seq").alias("last_seq"),
        counted.alias("events"),
        F.sum(F.when(F.col("event") == "node_started", 1).otherwise(0)).alias("starts"),
        F.sum(F.when(F.col("event") == "node_stopped", 1).otherwise(0)).alias("clean_stops"),
        F.sum(F.when(F.col("event") == "audit_dropped", F.col("count")).otherwise(0))
        .alias("events_dropped_by_policy"))
    if seq_counts is not None:
        counts = ev.sparkSession.createDataFrame(
            [(node, int(n)) for node, n in seq_counts.items()] or [("", 0)],
            "node string, distinct_seqs long")
        per_node = (per_node.join(F.broadcast(counts), "node", "left")
                    .withColumn("events", F.col("distinct_seqs")).drop("distinct_seqs"))
    per_node = per_node.withColumn(
        "missing_seqs", F.col("last_seq") - F.col("first_seq") + 1 - F.col("events")).cache()
    rows = _rows(per_node.transform(_sorted, "node"))
    return per_node, {"nodes": rows,
                      "missing_seqs": sum(r["missing_seqs"] or 0 for r in rows),
                      "events_dropped_by_policy": sum(r["events_dropped_by_policy"] or 0
                                                      for r in rows)}


def reconcile(ev: DataFrame, window_minutes: int = 60, grace_s: float = 60.0,
              as_of_us: int | None = None, copies: DataFrame | None = None,
              seq_counts: dict | None = None) -> tuple[dict, dict]:
    """Counts per vhost, queue and window; every copy without a final state enqueued more
    than ``grace_s`` before ``as_of_us`` (default: the trail's last event) is unaccounted."""
    if as_of_us is None:
        as_of_us = ev.agg(F.max("ts_us")).first()[0] or 0
    width = int(window_minutes) * 60_000_000
    copies = (queue_copies(ev) if copies is None else copies).withColumn(
        "start_ts", F.coalesce("enq_ts", "first_ts"))
    copies = copies.withColumn("window_start", F.floor(F.col("start_ts") / width) * width)
    fin = F.col("final")
    window_end = F.col("window_start") + width
    cutoff = as_of_us - int(grace_s * 1_000_000)

    def count(cond):
        return F.sum(F.when(cond, 1).otherwise(0))

    by_queue = copies.groupBy("vhost", "queue", "window_start").agg(
        count(F.col("enq_ts").isNotNull()).alias("enqueued"),
        count(F.col("first_delivery_ts").isNotNull()).alias("delivered"),
        F.sum("deliveries").alias("deliveries"),
        count(fin == "acked").alias("acked"),
        count(fin == "dead_lettered").alias("dead_lettered"),
        count(fin == "expired").alias("expired"),
        count(fin == "dropped").alias("dropped"),
        count((fin == "settled") & (F.col("final_reason") == "rejected")).alias("rejected"),
        count((fin == "settled") & F.col("final_reason").isNull()).alias("settled_other"),
        count(fin == "purged").alias("purged"),
        count(fin == "deleted").alias("deleted"),
        count(F.col("final_ts").isNull() | (F.col("final_ts") >= window_end))
        .alias("still_queued_at_window_end"),
        # at the end of the range audited (--to, else the last event): no final state yet,
        # unaccounted or not (within --grace)
        count(fin.isNull()).alias("still_queued_at_end"),
        count(fin.isNull() & (F.col("start_ts") < cutoff)).alias("unaccounted"))
    by_queue = by_queue.withColumn("window", _iso("window_start")).transform(_sorted,
        "vhost", "queue", "window_start").cache()
    pubs = ev.filter(F.col("event") == "published").withColumn(
        "window_start", F.floor(F.col("ts_us") / width) * width)
    o = F.col("outcome")
    publishes = pubs.groupBy("vhost", "window_start").agg(
        F.count(F.lit(1)).alias("published"), count(o == "routed").alias("routed"),
        count(o == "unroutable").alias("unroutable"), count(o == "returned").alias("returned"),
        count(o == "nacked").alias("nacked"), count(o == "taken").alias("taken"),
        count(F.col("persistent")).alias("persistent")
    ).withColumn("window", _iso("window_start")).transform(_sorted, "vhost", "window_start").cache()
    integrity, integrity_summary = trail_integrity(ev, seq_counts)
    queue_rows = _rows(by_queue)
    lost = copies.filter(fin.isNull() & (F.col("start_ts") < cutoff))
    named = ev
    if sum(r["unaccounted"] or 0 for r in queue_rows) <= 100_000:
        # the ids of the lost copies' messages only, not of every message of the trail
        named = ev.join(F.broadcast(lost.select("node", "msg")), ["node", "msg"], "left_semi")
    unaccounted = (lost.join(_message_ids(named), ["node", "msg"], "left")
                   .select("node", "vhost", "queue", "msg", "message_id", "ref_key",
                           _iso("start_ts").alias("enqueued_at"), "deliveries", "last_event",
                           _iso("last_ts").alias("last_event_at"))
                   .transform(_sorted, "vhost", "queue", "msg").cache())
    pub_rows = _rows(publishes)
    totals = {c: sum(r[c] or 0 for r in queue_rows) for c in (
        "enqueued", "delivered", "acked", "dead_lettered", "expired", "dropped", "rejected",
        "settled_other", "purged", "deleted", "unaccounted")}
    pub_totals = {c: sum(r[c] or 0 for r in pub_rows) for c in (
        "published", "routed", "unroutable", "returned", "nacked", "taken")}
    unaccounted_rows = _rows(unaccounted, 1000)
    summary = {
        "as_of": as_of_us, "grace_seconds": grace_s, "window_minutes": window_minutes,
        "queues": {k: int(v or 0) for k, v in totals.items()},
        "publishes": {k: int(v or 0) for k, v in pub_totals.items()},
        "unaccounted": int(totals.get("unaccounted") or 0),
        "still_queued_at_end": int(sum(r["still_queued_at_end"] or 0 for r in queue_rows)),
        "unaccounted_messages": unaccounted_rows,
        "trail": integrity_summary,
    }
    tables = {"by_queue": by_queue, "publishes": publishes, "unaccounted": unaccounted,
              "trail": integrity}
    stream_tables, summary["streams"] = reconcile_streams(ev, width)
    tables.update(stream_tables)
    return tables, summary


def stream_copies(ev: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(copies, per consumer): one row per stream copy (vhost, queue, offset) with its
    message, the consumers it was delivered to and whether retention removed it; one row per
    stream consumer (connection, consumer tag) with the copies it got. Offsets are the
    stream's, the same on every node: a copy is matched by offset, not by node."""
    e = F.col("event")
    appended = (ev.filter(e == "appended")
                .select("vhost", "queue", F.col("stream_offset").alias("offset"), "node", "msg",
                        F.col("ts_us").alias("appended_ts")))
    # a delivery to another node's link (detail forwarded) is a hop: that node's trail
    # has the consumer's delivery of it
    hop = F.coalesce(F.col("detail") == FORWARDED, F.lit(False))
    reads = (ev.filter((e == "delivered") & F.col("stream_offset").isNotNull() & ~hop)
             .select("vhost", "queue", "node", "connection", "consumer_tag", "ts_us",
                     F.explode(F.sequence(
                         F.col("stream_offset"),
                         F.col("stream_offset") + F.coalesce("stream_count", F.lit(1)) - 1))
                     .alias("offset")))
    got = (reads.join(appended.select("vhost", "queue", "offset"),
                      ["vhost", "queue", "offset"], "left_semi")
           .groupBy("vhost", "queue", "offset", "node", "connection", "consumer_tag")
           .agg(F.min("ts_us").alias("first_delivery_ts"), F.count(F.lit(1)).alias("sent")))
    cut = (ev.filter(e == "truncated")
           .select("vhost", "queue", F.col("stream_offset").alias("cut_from"),
                   (F.col("stream_offset") + F.col("stream_count")).alias("cut_to"),
                   F.col("reason").alias("cut_reason"), F.col("ts_us").alias("cut_ts")))
    truncated = (appended.alias("a").join(
        F.broadcast(cut).alias("t"),
        (F.col("a.vhost") == F.col("t.vhost")) & (F.col("a.queue") == F.col("t.queue"))
        & (F.col("a.offset") >= F.col("t.cut_from")) & (F.col("a.offset") < F.col("t.cut_to")))
        .groupBy("a.vhost", "a.queue", "a.offset")
        .agg(F.min("t.cut_ts").alias("truncated_ts"),
             F.min_by("t.cut_reason", "t.cut_ts").alias("truncated_reason")))
    per_copy = got.groupBy("vhost", "queue", "offset").agg(
        F.count(F.lit(1)).alias("consumers"), F.sum("sent").alias("deliveries"),
        F.min("first_delivery_ts").alias("first_delivery_ts"))
    copies = (appended.join(per_copy, ["vhost", "queue", "offset"], "left")
              .join(truncated, ["vhost", "queue", "offset"], "left")
              .fillna(0, ["consumers", "deliveries"]))
    consumers = got.groupBy("vhost", "queue", "node", "connection", "consumer_tag").agg(
        F.count(F.lit(1)).alias("delivered"), F.min("offset").alias("first_offset"),
        F.max("offset").alias("last_offset"))
    return copies, consumers


def reconcile_streams(ev: DataFrame, width: int) -> tuple[dict, dict]:
    """Per stream and window (by append time): appended, delivered (to at least one
    consumer), deliveries (one per consumer), truncated, still in the stream; and per
    consumer what it was delivered."""
    copies, consumers = stream_copies(ev)
    copies = copies.withColumn("window_start", F.floor(F.col("appended_ts") / width) * width)

    def count(cond):
        return F.sum(F.when(cond, 1).otherwise(0))

    by_stream = (copies.groupBy("vhost", "queue", "window_start").agg(
        F.count(F.lit(1)).alias("appended"),
        count(F.col("consumers") > 0).alias("delivered"),
        F.sum("consumers").alias("deliveries"),
        count(F.col("truncated_ts").isNotNull()
              & (F.col("truncated_reason") == "retention")).alias("truncated"),
        count(F.col("truncated_ts").isNotNull()
              & (F.col("truncated_reason") == "deleted")).alias("deleted"),
        count(F.col("truncated_ts").isNull()).alias("in_stream_at_end"))
        .withColumn("window", _iso("window_start"))
        .transform(_sorted, "vhost", "queue", "window_start").cache())
    consumers = consumers.transform(_sorted, "vhost", "queue", "node", "connection",
                                    "consumer_tag").cache()
    rows = _rows(by_stream)
    totals = {c: int(sum(r[c] or 0 for r in rows)) for c in (
        "appended", "delivered", "deliveries", "truncated", "deleted", "in_stream_at_end")}
    summary = {**totals, "consumers": _rows(consumers, 1000)}
    return {"streams": by_stream, "stream_consumers": consumers}, summary


def _stream_reads_of(ev: DataFrame, history: DataFrame) -> DataFrame:
    """The events of streams' offset ranges (deliveries, acks, truncations: no msg of their
    own) that hold a record of ``history``'s messages, each named by that message."""
    loc = (history.filter(F.col("event") == "appended")
           .select(F.col("vhost").alias("l_vhost"), F.col("queue").alias("l_queue"),
                   F.col("stream_offset").alias("l_offset"), F.col("msg").alias("l_msg")))
    start = F.col("stream_offset")
    return (ev.filter(start.isNotNull() & F.col("msg").isNull())
            .join(F.broadcast(loc), (F.col("vhost") == F.col("l_vhost"))
                  & (F.col("queue") == F.col("l_queue")) & (F.col("l_offset") >= start)
                  & (F.col("l_offset") < start + F.coalesce("stream_count", F.lit(1))))
            .withColumn("msg", F.col("l_msg"))
            .drop("l_vhost", "l_queue", "l_offset", "l_msg"))


def _producer(ev: DataFrame, key: str):
    if key == "app_id":
        return F.col("app_id")
    if key == "producer":
        return F.col("producer")
    return F.coalesce(F.col("producer"), F.col("app_id"))


def sequence(ev: DataFrame, producer_key: str = "auto") -> tuple[dict, dict]:
    """Per producer: gaps, out-of-order and duplicate publishes; copies acked more than once."""
    pubs = (ev.filter((F.col("event") == "published") & F.col("producer_seq").isNotNull())
            .withColumn("producer", _producer(ev, producer_key))
            .filter(F.col("producer").isNotNull())
            .select("node", "vhost", "producer", "producer_seq", "seq", "msg", "message_id",
                    "ts_us"))
    pubs = pubs.cache()
    dups = (pubs.groupBy("producer", "producer_seq")
            .agg(F.count(F.lit(1)).alias("publishes"),
                 F.sort_array(F.collect_list("msg")).alias("msgs"),
                 F.sort_array(F.collect_set("message_id")).alias("message_ids"))
            .filter(F.col("publishes") > 1).transform(_sorted, "producer", "producer_seq").cache())
    distinct = pubs.select("producer", "producer_seq").distinct()
    w = Window.partitionBy("producer").orderBy("producer_seq")
    gaps = (distinct.withColumn("prev", F.lag("producer_seq").over(w))
            .filter(F.col("producer_seq") - F.col("prev") > 1)
            .select("producer", (F.col("prev") + 1).alias("missing_from"),
                    (F.col("producer_seq") - 1).alias("missing_to"),
                    (F.col("producer_seq") - F.col("prev") - 1).alias("missing"))
            .transform(_sorted, "producer", "missing_from").cache())
    order = Window.partitionBy("producer").orderBy("seq")
    first = Window.partitionBy("producer", "producer_seq").orderBy("seq")
    ooo = (pubs.withColumn("prev_max", F.max("producer_seq").over(
                order.rowsBetween(Window.unboundedPreceding, -1)))
           .withColumn("occurrence", F.row_number().over(first))
           .filter((F.col("occurrence") == 1) & (F.col("producer_seq") < F.col("prev_max")))
           .select("producer", "producer_seq", "prev_max", "msg", "message_id",
                   _iso("ts_us").alias("published_at"))
           .transform(_sorted, "producer", "producer_seq").cache())
    per_producer = (pubs.groupBy("producer").agg(
        F.count(F.lit(1)).alias("publishes"),
        F.countDistinct("producer_seq").alias("distinct_seqs"),
        F.min("producer_seq").alias("first_seq"), F.max("producer_seq").alias("last_seq"))
        .transform(_sorted, "producer").cache())
    ids = _message_ids(ev)
    acks = (ev.filter(F.col("event") == "acked").select("node", "vhost", "queue", "msg")
            .join(ids, ["node", "msg"], "left")
            .join(pubs.select("node", "msg", "producer", "producer_seq"), ["node", "msg"], "left")
            .withColumn("key", F.coalesce(
                F.col("message_id"),
                F.concat_ws("#", F.col("producer"), F.col("producer_seq").cast("string"))))
            .filter(F.col("key").isNotNull() & (F.col("key") != "")))
    acked_twice = (acks.groupBy("vhost", "queue", "key")
                   .agg(F.count(F.lit(1)).alias("acks"),
                        F.sort_array(F.collect_list("msg")).alias("msgs"))
                   .filter(F.col("acks") > 1).transform(_sorted, "vhost", "queue", "key").cache())
    gap_rows = _rows(gaps, 1000)
    summary = {
        "producers": _rows(per_producer, 1000),
        "gaps": gap_rows,
        "missing": sum(r["missing"] for r in gap_rows),
        "duplicates": _rows(dups, 1000),
        "out_of_order": _rows(ooo, 1000),
        "acked_more_than_once": _rows(acked_twice, 1000),
    }
    tables = {"producers": per_producer, "gaps": gaps, "duplicates": dups, "out_of_order": ooo,
              "acked_more_than_once": acked_twice}
    return tables, summary


def _percentiles(df: DataFrame, keys: list[str], value: str) -> DataFrame:
    return df.groupBy(*keys).agg(
        F.count(value).alias("count"),
        F.percentile_approx(value, 0.5, 10000).alias("p50_ms"),
        F.percentile_approx(value, 0.95, 10000).alias("p95_ms"),
        F.percentile_approx(value, 0.99, 10000).alias("p99_ms"),
        F.max(value).alias("max_ms"))


def latency(ev: DataFrame, copies: DataFrame | None = None,
            window: tuple[int | None, int | None] = (None, None)) -> tuple[dict, dict]:
    """publish -> first delivery, publish -> ack per queue and time bucket; scheduler
    lateness. The bucket's width follows the range (``window``: first and last µs):
    ``bucket_seconds``."""
    width = bucket_seconds(*window)
    copies = (queue_copies(ev) if copies is None else copies).filter(F.col("enq_ts").isNotNull()).withColumn(
        "bucket", _bucket(F.col("enq_ts"), width))
    parts = []
    for metric, end in (("publish_to_first_delivery", "first_delivery_ts"),
                        ("publish_to_ack", "ack_ts")):
        parts.append(copies.filter(F.col(end).isNotNull()).select(
            "vhost", "queue", "bucket", F.lit(metric).alias("metric"),
            ((F.col(end) - F.col("enq_ts")) / 1000.0).alias("ms")))
    fired = (ev.filter(F.col("event") == "fired")
             .select("vhost", F.explode_outer("queues").alias("queue"), "ts_us", "due_us")
             .select("vhost", F.coalesce("queue", F.lit("(unroutable)")).alias("queue"),
                     _bucket(F.col("due_us"), width).alias("bucket"),
                     F.lit("scheduled_due_to_fire").alias("metric"),
                     ((F.col("ts_us") - F.col("due_us")) / 1000.0).alias("ms")))
    parts.append(fired)
    samples = parts[0].unionByName(parts[1]).unionByName(parts[2])
    by_bucket = _percentiles(samples, ["metric", "vhost", "queue", "bucket"], "ms").transform(
        _sorted, "metric", "vhost", "queue", "bucket").cache()
    overall = _percentiles(samples, ["metric"], "ms").transform(_sorted, "metric").cache()
    summary = {"bucket_seconds": width, "overall": _rows(overall),
               "by_queue_bucket": _rows(by_bucket, 2000)}
    return {"by_queue_bucket": by_bucket, "overall": overall}, summary


def deadletters(ev: DataFrame, copies: DataFrame | None = None) -> tuple[dict, dict]:
    """Dead letters by reason, queue and hour; time before dead-lettering; top routing keys."""
    dl = (ev.filter((F.col("event") == "dead_lettered")
                    | ((F.col("event") == "expired") & F.col("target").isNotNull()))
          .select("node", "vhost", "queue", "msg", "ts_us", "target",
                  F.coalesce("reason", F.lit("expired")).alias("reason")))
    by_reason = (dl.withColumn("hour", _hour(F.col("ts_us")))
                 .groupBy("reason", "vhost", "queue", "hour")
                 .agg(F.count(F.lit(1)).alias("dead_letters"))
                 .transform(_sorted, "reason", "vhost", "queue", "hour").cache())
    copies = (queue_copies(ev) if copies is None else copies).select(
        "node", "vhost", "queue", "msg", "enq_ts")
    waited = (dl.join(copies, ["node", "vhost", "queue", "msg"], "left")
              .filter(F.col("enq_ts").isNotNull())
              .withColumn("ms", (F.col("ts_us") - F.col("enq_ts")) / 1000.0))
    time_before = _percentiles(waited, ["reason", "vhost", "queue"], "ms").transform(_sorted,
        "reason", "vhost", "queue").cache()
    keys = (dl.join(_message_ids(ev), ["node", "msg"], "left")
            .groupBy("vhost", "queue", "routing_key").agg(F.count(F.lit(1)).alias("dead_letters"))
            .orderBy(F.desc("dead_letters"), "vhost", "queue", "routing_key").limit(20).cache())
    reason_rows = _rows(by_reason)
    totals: dict = {}
    for r in reason_rows:
        totals[r["reason"]] = totals.get(r["reason"], 0) + r["dead_letters"]
    summary = {"by_reason": totals, "total": sum(totals.values()),
               "by_reason_queue_hour": reason_rows[:2000],
               "time_before_dead_letter": _rows(time_before, 1000),
               "top_routing_keys": _rows(keys)}
    return {"by_reason": by_reason, "time_before": time_before, "top_routing_keys": keys}, summary


def track(ev: DataFrame, message_id: str | None = None, ref_key: str | None = None,
          msg: int | None = None, consumer: str | None = None,
          limit: int = 10000) -> tuple[dict, dict]:
    """One message's whole history (by message id, x-ref-key or broker id), or what one
    consumer did; with none of them, every event of the time range."""
    cond = None
    for column, value in (("message_id", message_id), ("ref_key", ref_key), ("msg", msg)):
        if value is not None:
            c = F.col(column) == F.lit(value)
            cond = c if cond is None else cond | c
    cols = ["seq", "node", "event", "vhost", "queue", "exchange", "routing_key", "msg",
            "message_id", "ref_key", "consumer_tag", "delivery_tag", "redelivered",
            "delivery_count", "requeue", "reason", "target", "outcome", "queues", "connection",
            "user", "ts_us", "stream_offset", "stream_count"]
    if cond is not None:
        keys = ev.filter(cond).select("node", "msg").distinct()
        history = ev.join(keys, ["node", "msg"], "inner")
        history = history.unionByName(_stream_reads_of(ev, history))
    elif consumer is not None:
        history = ev.filter(F.col("consumer_tag") == consumer).drop("message_id", "ref_key").join(
            _message_ids(ev).drop("routing_key"), ["node", "msg"], "left")
    else:
        history = ev
    if consumer is not None and cond is not None:
        history = history.filter(F.col("consumer_tag").isNull()
                                 | (F.col("consumer_tag") == consumer))
    history = (history.select(*cols).withColumn("at", _iso("ts_us"))
               .orderBy("ts_us", "seq"))
    rows = _rows(history, limit)
    summary = {"query": {"message_id": message_id, "ref_key": ref_key, "msg": msg,
                         "consumer": consumer},
               "events": len(rows), "history": rows,
               "final": [r["event"] for r in rows if r["event"] in FINAL]}
    return {"history": history}, summary
