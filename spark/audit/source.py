"""The audit trail as a Spark DataFrame.

pip's pyspark has no spark-avro module, so the files are read with the broker's own
reader (``broker.audit.reader``: its generated decoder per block, damaged blocks skipped)
inside the executors: Spark's ``binaryFile`` source lists and loads the files (any path
Spark reads: local, HDFS, S3, with the ``dt=/hour=/node=`` partitions below it),
``mapInArrow`` decodes them into Arrow batches of the columns a job asks for (no row is
pickled between the JVM and the Python workers). With a local master and local files,
a file is not one task: each task maps the file and decodes the blocks that start in its
byte range (``_Share``), so the cores stay busy whatever the files' sizes (a trail file
is up to ``--audit-roll-bytes``, 64 MiB, and an hour's last file is small). Damage found
on the way (corrupt
block, torn tail, unreadable header) is collected in an accumulator as
``(path, offset, kind, detail)``; a file of a newer schema version becomes a problem of
kind ``unknown schema version`` that the caller turns into an error naming the file.
"""
from __future__ import annotations

from urllib.parse import unquote, urlparse

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

UNKNOWN_VERSION = "unknown schema version"

# The columns of the trail (audit_event_v2.avsc; a version 1 file has no stream_offset
# and stream_count: None) and their Spark types.
_TYPES = {
    "seq": T.LongType(), "ts_us": T.LongType(), "node": T.StringType(),
    "event": T.StringType(), "vhost": T.StringType(), "queue": T.StringType(),
    "exchange": T.StringType(), "routing_key": T.StringType(), "msg": T.LongType(),
    "message_id": T.StringType(), "correlation_id": T.StringType(), "app_id": T.StringType(),
    "ref_key": T.StringType(), "producer": T.StringType(), "producer_seq": T.LongType(),
    "body_size": T.LongType(), "persistent": T.BooleanType(), "user": T.StringType(),
    "connection": T.StringType(), "channel": T.IntegerType(), "confirm_seq": T.LongType(),
    "outcome": T.StringType(), "queues": T.ArrayType(T.StringType()),
    "consumer_tag": T.StringType(), "delivery_tag": T.LongType(),
    "redelivered": T.BooleanType(), "delivery_count": T.IntegerType(),
    "requeue": T.BooleanType(), "reason": T.StringType(), "target": T.StringType(),
    "due_us": T.LongType(), "count": T.LongType(), "detail": T.StringType(),
    "stream_offset": T.LongType(), "stream_count": T.LongType(),  # version 2
}
COLUMNS = tuple(_TYPES)
_BATCH_ROWS = 65536


def _arrow_types() -> dict:
    import pyarrow as pa
    simple = {"LongType": pa.int64(), "StringType": pa.string(), "BooleanType": pa.bool_(),
              "IntegerType": pa.int32()}
    return {c: simple.get(type(t).__name__, pa.list_(pa.string())) for c, t in _TYPES.items()}


_ARROW = _arrow_types()


def _record_batch(pa, schema, rows: list, empty: list):
    columns = list(zip(*rows, strict=True)) if rows else empty
    return pa.RecordBatch.from_arrays(
        [pa.array(col, type=f.type) for col, f in zip(columns, schema, strict=True)],
        schema=schema)


def _open(path: str):
    """The file's bytes, mapped (a task touches only the pages of its share)."""
    import mmap
    with open(path, "rb") as f:
        try:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # empty: nothing to map
            return b""


def _local(uri: str) -> str | None:
    u = urlparse(uri)
    return unquote(u.path) if u.scheme in ("", "file") else None


def _shares(files: list, share_bytes: int, tasks: int,
            least: int = 1 << 20) -> list[tuple[str, int, int]]:
    """(path, lo, hi) byte ranges of about ``share_bytes`` (at least ``least``), at least
    ``tasks`` of them when the files are large enough."""
    total = sum(size for _, size in files) or 1
    share = max(least, min(share_bytes, total // max(tasks, 1) + 1))
    out: list = []
    for path, size in files:
        n = max(1, -(-size // share))
        step = -(-size // n) if size else 1
        out.extend((path, i * step, size if i == n - 1 else (i + 1) * step) for i in range(n))
    return out


class _Problems(AccumulatorParam):
    def zero(self, value):
        return []

    def addInPlace(self, value1, value2):
        value1.extend(value2)
        return value1


class Trail:
    """The events of the files under ``path`` (``columns`` only), and what was damaged."""

    def __init__(self, spark: SparkSession, path: str, columns=COLUMNS,
                 from_us: int | None = None, to_us: int | None = None,
                 split: bool = True) -> None:
        self.spark = spark
        self.path = path
        self.columns = tuple(columns)
        self._acc = spark.sparkContext.accumulator([], _Problems())
        # per decoded block: (path, offset, node, first seq, last seq), or None for the
        # node when the block's events are not one run of consecutive numbers of one node
        self._runs = spark.sparkContext.accumulator([], _Problems())
        # per block read, whatever the time range: (path, offset, node, first seq, count,
        # first ts_us), from which the trail's completeness is judged (``completeness``)
        self._blocks = spark.sparkContext.accumulator([], _Problems())
        listing = (spark.read.format("binaryFile").option("pathGlobFilter", "*.avro")
                   .option("recursiveFileLookup", "true").load(path))
        acc, runs, blocks = self._acc, self._runs, self._blocks
        cols = self.columns
        lo, hi = from_us, to_us
        schema = T.StructType([T.StructField(c, _TYPES[c], True) for c in cols])
        sc = spark.sparkContext
        if split and (sc.master or "").startswith("local"):
            # listed by Spark (its rules for hidden files and partition directories); the
            # contents are not loaded when only path and length are selected
            found = [(r[0], r[1]) for r in listing.select("path", "length").collect()]
            if all(_local(p) is not None for p, _ in found):
                self.files = listing.select("path")
                share = int(str(spark.conf.get("spark.sql.files.maxPartitionBytes",
                                                str(16 << 20))).rstrip("b"))
                shares = _shares(found, share, 2 * sc.defaultParallelism) or [("", 0, 0)]
                rdd = sc.parallelize(shares, len(shares))
                ranges = spark.createDataFrame(rdd, "path string, lo long, hi long")
                self.df: DataFrame = ranges.mapInArrow(
                    lambda batches: _decode_shares(batches, cols, lo, hi, acc, runs, blocks),
                    schema)
                return
        files = listing.select("path", "content")
        self.files = files

        def decode(batches):
            # Spark hands over the files as Arrow batches of (path, content) and takes the
            # events back as Arrow batches: no row is pickled on either side.
            import pyarrow as pa

            from broker.audit.reader import UnknownSchemaVersion
            arrow_schema = pa.schema([(c, _ARROW[c]) for c in cols])
            empty: list = [[] for _ in cols]
            for batch in batches:
                paths = batch.column(0).to_pylist()
                contents = batch.column(1)
                for i, path in enumerate(paths):
                    try:
                        reader = _share_reader()(path, contents[i].as_buffer().to_pybytes(),
                                                 0, 1 << 62)
                    except UnknownSchemaVersion as exc:
                        acc.add([(path, 0, UNKNOWN_VERSION, str(exc))])
                        continue
                    yield from _file_batches(pa, reader, cols, lo, hi, arrow_schema, empty,
                                             acc, runs, blocks)

        self.df = files.mapInArrow(decode, schema)

    def problems(self) -> list[tuple]:
        """Damage seen so far (after an action), each ``(path, offset, kind, detail)`` once."""
        seen = []
        for p in self._acc.value:
            p = tuple(p)
            if p not in seen:
                seen.append(p)
        return sorted(seen)

    def seq_counts(self) -> dict | None:
        """Per node, how many distinct sequence numbers the events read so far have (after
        an action that read every file), from the blocks' runs; None when a block was not
        one run of consecutive numbers of one node (then they are counted in Spark)."""
        return seq_counts(self._runs.value)

    def blocks(self) -> list[tuple]:
        """Every block read so far (after an action), once: ``(path, offset, node, first
        seq, count, first ts_us)``."""
        return sorted({(b[0], b[1]): tuple(b) for b in self._blocks.value}.values())

    def check_versions(self) -> None:
        for path, _, kind, detail in self.problems():
            if kind == UNKNOWN_VERSION:
                raise SchemaVersionError(detail or path)


class SchemaVersionError(Exception):
    pass


def seq_counts(runs: list) -> dict | None:
    """``(path, offset, node, first, last)`` per block (``node`` None: not one run) -> per
    node the size of the union of the runs (a block reported twice, or a file read under
    two names, counts once); None if a block was not one run."""
    unique: dict = {}
    for path, offset, node, first, last in runs:
        if node is None:
            return None
        unique[(path, offset)] = (node, first, last)
    by_node: dict = {}
    for node, first, last in unique.values():
        by_node.setdefault(node, []).append((first, last))
    counts = {}
    for node, spans in by_node.items():
        spans.sort()
        total, end = 0, None
        for first, last in spans:
            if end is not None and first <= end:
                if last > end:
                    total += last - end
                    end = last
                continue
            total += last - first + 1
            end = last
        counts[node] = total
    return counts


def _share_reader():
    from broker.audit.reader import FileReader

    class Share(FileReader):
        """The blocks of one file that start in ``[start, end)``: every share scans the
        framing from the header (the same spans, the same framing problems: reported
        once, ``Trail.problems``) and decodes only its own blocks; ``at`` is the offset of
        the block last handed out."""

        def __init__(self, uri: str, data, start: int, end: int) -> None:
            self.range = (start, end)
            self.at = 0
            super().__init__(uri, data)

        def _spans(self):
            start, end = self.range
            for span in super()._spans():
                if span[0] >= end:
                    return  # the framing after it is the next share's to check
                if span[0] >= start:
                    self.at = span[0]
                    yield span

    return Share


def _block_head(head: bytes) -> tuple[int, int, str] | None:
    """(seq, ts_us, node) of the first record of a block's decoded data: the schema's
    first three fields (long, long, string), which every version keeps."""
    from broker.audit.reader import _varint
    try:
        seq, p = _varint(head, 0)
        ts, p = _varint(head, p)
        n, p = _varint(head, p)
        if n < 0 or p + n > len(head):
            return None
        return seq, ts, head[p:p + n].decode()
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def _file_batches(pa, reader, cols, lo, hi, arrow_schema, empty: list, acc, runs,
                  blocks=None):
    """Arrow batches of one reader's events; its problems, its blocks' sequence runs and
    every block's place in the sequence go to the accumulators."""
    si = cols.index("seq") if "seq" in cols else None
    ni = cols.index("node") if "node" in cols else None
    found: list = []
    placed: list = []
    rows: list = []
    for block in reader.rows_iter(cols, lo, hi):
        if reader.block is not None:
            offset, count, head = reader.block
            first = _block_head(head)
            if first is not None and count:
                placed.append((reader.path, offset, first[2], first[0], count, first[1]))
        if block and si is not None and ni is not None:
            first = block[0][si]
            node = block[0][ni]
            # one run of consecutive numbers of one node (the broker's writer makes each
            # block one batch of the sequence); else None: counted in Spark
            if not ([r[si] for r in block] == list(range(first, first + len(block)))
                    and all(r[ni] == node for r in block)):
                node = None
            found.append((reader.path, reader.at, node, first, first + len(block) - 1))
        rows += block
        if len(rows) >= _BATCH_ROWS:
            yield _record_batch(pa, arrow_schema, rows, empty)
            rows = []
    if rows:
        yield _record_batch(pa, arrow_schema, rows, empty)
    if reader.problems:
        acc.add([tuple(p) for p in reader.problems])
    if found:
        runs.add(found)
    if placed and blocks is not None:
        blocks.add(placed)


def _decode_shares(batches, cols: tuple, lo, hi, acc, runs, blocks=None):
    """mapInArrow over (path, lo, hi) rows: the events of the blocks starting in each range."""
    import pyarrow as pa

    from broker.audit.reader import UnknownSchemaVersion

    share = _share_reader()
    arrow_schema = pa.schema([(c, _ARROW[c]) for c in cols])
    empty: list = [[] for _ in cols]
    for batch in batches:
        uris, starts, ends = (batch.column(i).to_pylist() for i in range(3))
        for uri, start, end in zip(uris, starts, ends, strict=True):
            if not uri:
                continue
            path = _local(uri)
            assert path is not None
            try:
                reader = share(uri, _open(path), start, end)
            except UnknownSchemaVersion as exc:
                acc.add([(uri, 0, UNKNOWN_VERSION, str(exc))])
                continue
            yield from _file_batches(pa, reader, cols, lo, hi, arrow_schema, empty, acc, runs,
                                     blocks)
