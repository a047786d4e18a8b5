"""The audit trail as a Spark DataFrame.

pip's pyspark has no spark-avro module, so the files are read with the broker's own
reader (``broker.audit.reader``: its generated decoder per block, damaged blocks skipped)
inside the executors: Spark's ``binaryFile`` source lists and loads the files (any path
Spark reads: local, HDFS, S3, with the ``dt=/hour=/node=`` partitions below it),
``mapInArrow`` decodes them into Arrow batches of the columns a job asks for (no row is
pickled between the JVM and the Python workers). Damage found on the way (corrupt
block, torn tail, unreadable header) is collected in an accumulator as
``(path, offset, kind, detail)``; a file of a newer schema version becomes a problem of
kind ``unknown schema version`` that the caller turns into an error naming the file.
"""
from __future__ import annotations

from pyspark.accumulators import AccumulatorParam
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

UNKNOWN_VERSION = "unknown schema version"

# The columns of the trail (audit_event_v1.avsc) and their Spark types.
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


class _Problems(AccumulatorParam):
    def zero(self, value):
        return []

    def addInPlace(self, value1, value2):
        value1.extend(value2)
        return value1


class Trail:
    """The events of the files under ``path`` (``columns`` only), and what was damaged."""

    def __init__(self, spark: SparkSession, path: str, columns=COLUMNS,
                 from_us: int | None = None, to_us: int | None = None) -> None:
        self.spark = spark
        self.path = path
        self.columns = tuple(columns)
        self._acc = spark.sparkContext.accumulator([], _Problems())
        files = (spark.read.format("binaryFile").option("pathGlobFilter", "*.avro")
                 .option("recursiveFileLookup", "true").load(path).select("path", "content"))
        self.files = files
        acc = self._acc
        cols = self.columns
        lo, hi = from_us, to_us

        def decode(batches):
            # Spark hands over the files as Arrow batches of (path, content) and takes the
            # events back as Arrow batches: no row is pickled on either side.
            import pyarrow as pa

            from broker.audit.reader import FileReader, UnknownSchemaVersion
            arrow_schema = pa.schema([(c, _ARROW[c]) for c in cols])
            empty = [[] for _ in cols]
            for batch in batches:
                paths = batch.column(0).to_pylist()
                contents = batch.column(1)
                for i, path in enumerate(paths):
                    try:
                        reader = FileReader(path, contents[i].as_buffer().to_pybytes())
                    except UnknownSchemaVersion as exc:
                        acc.add([(path, 0, UNKNOWN_VERSION, str(exc))])
                        continue
                    rows: list = []
                    for block in reader.rows_iter(cols, lo, hi):
                        rows += block
                        if len(rows) >= _BATCH_ROWS:
                            yield _record_batch(pa, arrow_schema, rows, empty)
                            rows = []
                    if rows:
                        yield _record_batch(pa, arrow_schema, rows, empty)
                    if reader.problems:
                        acc.add([tuple(p) for p in reader.problems])

        schema = T.StructType([T.StructField(c, _TYPES[c], True) for c in cols])
        self.df: DataFrame = files.mapInArrow(decode, schema)

    def problems(self) -> list[tuple]:
        """Damage seen so far (after an action), each ``(path, offset, kind, detail)`` once."""
        seen = []
        for p in self._acc.value:
            p = tuple(p)
            if p not in seen:
                seen.append(p)
        return sorted(seen)

    def check_versions(self) -> None:
        for path, _, kind, detail in self.problems():
            if kind == UNKNOWN_VERSION:
                raise SchemaVersionError(detail or path)


class SchemaVersionError(Exception):
    pass
