"""``triomq-stream``: a Spark 4 Python data source over TrioMQ (or RabbitMQ) streams.

    from spark.streams.source import register
    register(spark)
    df = (spark.readStream.format("triomq-stream")
          .option("port", 5552).option("stream", "orders")   # or .option("superstream", "s")
          .option("startingOffsets", "first").load())

The driver asks the broker for each partition's end offset (StreamStats, then the last
chunk) and plans one Spark partition per stream partition for the offsets between two
micro-batches; executors read exactly that range with their own connection
(``client.StreamClient``: blocking sockets, no event loop). Offsets are the stream's own,
contiguous per partition, so Spark's checkpoint holds ``{partition: next offset}`` as JSON
and a query restarted from it reads every record once: a micro-batch's range is fixed in
the offset log before it runs, and it reads the same records however often it is re-run.

Options: host (127.0.0.1), port (5552), vhost (/), user/password (guest), stream or
superstream (its partitions, from the Partitions command, are the Spark partitions),
startingOffsets (``first``, ``last`` -- the last chunk, as RabbitMQ --, ``next`` -- only
new records --, ``offset N``, ``timestamp MS``, or JSON ``{"partition": N}``; default
``next`` for streaming, ``first`` for batch), endingOffsets (batch: ``latest`` (default),
``offset N`` or JSON), maxRecordsPerTrigger.
"""
from __future__ import annotations

import json
from datetime import UTC, datetime

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

NAME = "triomq-stream"

SCHEMA = ("stream string, partition string, offset long, timestamp timestamp, "
          "exchange string, routing_key string, body binary, "
          "properties map<string,string>, application_properties map<string,string>")


def register(spark) -> None:
    spark.dataSource.register(TrioMQStreamSource)


class Options:
    """The connection options, picklable (shipped to the executors)."""

    def __init__(self, options):
        o = {k.lower(): v for k, v in options.items()}
        self.host = o.get("host", "127.0.0.1")
        self.port = int(o.get("port", 5552))
        self.vhost = o.get("vhost", "/")
        self.user = o.get("user", "guest")
        self.password = o.get("password", "guest")
        self.stream = o.get("stream")
        self.superstream = o.get("superstream")
        if bool(self.stream) == bool(self.superstream):
            raise ValueError("give one of the options 'stream' and 'superstream'")
        self.starting = o.get("startingoffsets")
        self.ending = o.get("endingoffsets", "latest")
        self.max_records = int(o["maxrecordspertrigger"]) if "maxrecordspertrigger" in o else None

    @property
    def name(self) -> str:
        return self.stream or self.superstream or ""

    def client(self):
        from .client import StreamClient
        return StreamClient(self.host, self.port, self.vhost, self.user, self.password)

    def partitions(self, client) -> list[str]:
        if self.stream:
            return [self.stream]
        return client.partitions(self.superstream)


def resolve(spec: str, client, partitions: list[str]) -> dict[str, int]:
    """An offset option, as ``{partition: offset}``."""
    spec = spec.strip()
    if spec.startswith("{"):
        given = {str(k): int(v) for k, v in json.loads(spec).items()}
        unknown = set(given) - set(partitions)
        if unknown:
            raise ValueError(f"offsets for partitions that are not there: {sorted(unknown)}")
        return {p: given[p] if p in given else client.first_offset(p) for p in partitions}
    word, _, arg = spec.partition(" ")
    word = word.lower()
    out = {}
    for p in partitions:
        if word == "first":
            out[p] = client.first_offset(p)
        elif word in ("next", "latest"):
            out[p] = client.end_offset(p)
        elif word == "last":
            out[p] = max(client.committed_chunk(p), 0)
        elif word == "offset":
            out[p] = int(arg)
        elif word == "timestamp":
            out[p] = client.offset_at(p, int(arg))
        else:
            raise ValueError(f"unknown offset specification {spec!r}")
    return out


class StreamRange(InputPartition):
    def __init__(self, partition: str, start: int, end: int):
        super().__init__((partition, start, end))
        self.partition, self.start, self.end = partition, start, end


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def read_range(opts: Options, part: StreamRange):
    from broker.streams import record
    with opts.client() as client:
        for r in client.records(part.partition, part.start, part.end):
            try:
                exchange, routing_key, _raw, props, body = record.decode(r.data)
            except record.DecodeError:  # not an AMQP 1.0 message: the bytes as they are
                exchange, routing_key, props, body = None, None, {}, r.data
            headers = props.get("headers") or {}
            properties = {k: _text(v) for k, v in props.items()
                          if k != "headers" and v is not None}
            app = {str(k): _text(v) for k, v in headers.items() if v is not None}
            yield (opts.name, part.partition, r.offset,
                   datetime.fromtimestamp(r.timestamp_ms / 1000, tz=UTC),
                   exchange, routing_key, bytes(body), properties, app)


def _ranges(start: dict, end: dict) -> list[StreamRange]:
    return [StreamRange(p, int(start.get(p, 0)), int(e)) for p, e in sorted(end.items())
            if int(e) > int(start.get(p, 0))]


class TrioMQStreamSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self):
        return SCHEMA

    def reader(self, schema) -> DataSourceReader:
        return BatchReader(Options(self.options))

    def streamReader(self, schema) -> DataSourceStreamReader:
        return StreamReader(Options(self.options))


class BatchReader(DataSourceReader):
    def __init__(self, opts: Options):
        self.opts = opts
        with opts.client() as client:
            parts = opts.partitions(client)
            self.start = resolve(opts.starting or "first", client, parts)
            self.end = resolve(opts.ending, client, parts)

    def partitions(self):
        return _ranges(self.start, self.end) or [StreamRange("", 0, 0)]

    def read(self, partition):
        if partition.end <= partition.start:
            return iter(())
        return read_range(self.opts, partition)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: Options):
        self.opts = opts
        self.target: dict[str, int] | None = None  # Trigger.AvailableNow's end

    def _ends(self) -> dict[str, int]:
        with self.opts.client() as client:
            return {p: client.end_offset(p) for p in self.opts.partitions(client)}

    def initialOffset(self) -> dict:
        with self.opts.client() as client:
            return resolve(self.opts.starting or "next", client, self.opts.partitions(client))

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._ends()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records:
            return ReadMaxRows(self.opts.max_records)
        return ReadAllAvailable()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = dict(self.target) if self.target is not None else self._ends()
        # a partition added to a super stream since the last batch starts at its first offset
        out = {p: max(e, int(start.get(p, 0))) for p, e in ends.items()}
        for p, off in start.items():
            out.setdefault(p, int(off))
        if isinstance(limit, ReadMaxRows):
            budget = limit.max_rows
            waiting = sorted(p for p in out if out[p] > int(start.get(p, 0)))
            for i, p in enumerate(waiting):
                share = budget // (len(waiting) - i)
                s = int(start.get(p, 0))
                out[p] = s + min(out[p] - s, share)
                budget -= out[p] - s
        return out

    def reportLatestOffset(self):
        return self._ends()

    def partitions(self, start: dict, end: dict):
        return _ranges(start, end)

    def read(self, partition):
        return read_range(self.opts, partition)

    def commit(self, end: dict) -> None:
        pass  # the stream keeps everything until retention: nothing to release
