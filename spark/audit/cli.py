"""``python -m spark.audit {reconcile,sequence,latency,deadletters,track,report}
--input PATH --output PATH [--master URL] [--from T --to T] ...``

Exit status: 0 fine, 1 reconcile found unaccounted messages or sequence found gaps (so a
cron or CI can gate on it; ``report`` runs both), 2 bad input (one line on stderr): an
invalid ``--from``/``--to``, an input without audit files, a file of an unknown schema
version, PySpark not installed; 3 the trail is incomplete: its own sequence numbers show
events missing (a torn or unreadable file, a file missing between two others), one line
on stderr per gap naming the node, the missing seq range and the file(s). 3 wins over 1:
counts over an incomplete trail cannot be trusted.

Progress goes to stderr (``spark.audit: ...`` lines, Spark's own log at ERROR only), the
one-line result to stdout; ``--quiet`` keeps only warnings and errors.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
import zipfile
from urllib.parse import urlparse

JOBS = ("reconcile", "sequence", "latency", "deadletters", "track", "report")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXIT_OK, EXIT_FOUND, EXIT_BAD_INPUT, EXIT_INCOMPLETE = 0, 1, 2, 3
INSTALL_HINT = ("the audit jobs need PySpark, pyarrow and pandas: pip install -e '.[audit]' "
                "(or pip install 'triomq[audit]'), and Java 17")


class BadInput(Exception):
    pass


def parse_time(text: str, option: str) -> int:
    """ISO 8601 (naive = UTC) or seconds since the epoch -> microseconds since the epoch."""
    try:
        return int(float(text) * 1_000_000)
    except ValueError:
        pass
    try:
        t = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"{option} {text!r}: not a time (ISO 8601 like 2026-11-24T09:00:00Z, "
                       f"or seconds since the epoch)") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=datetime.UTC)
    return int(t.timestamp() * 1_000_000)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m spark.audit", description="Batch audits of TrioMQ's audit trail on Spark",
        epilog="exit status: 0 fine; 1 unaccounted messages (reconcile) or producer gaps "
               "(sequence); 2 bad input (one line on stderr); 3 the trail is incomplete (its "
               "sequence numbers show events missing: one line per gap naming the node, the "
               "seq range and the file)")
    p.add_argument("job", choices=JOBS)
    p.add_argument("--input", default=None,
                   help="the trail: a directory or any path Spark reads (not with --follow)")
    p.add_argument("--output", required=True, help="where Parquet tables, summary.json and "
                                                   "report.html go")
    p.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    p.add_argument("--from", dest="from_", default=None, metavar="T",
                   help="only events at or after T (ISO 8601 or epoch seconds)")
    p.add_argument("--to", default=None, metavar="T", help="only events before T")
    p.add_argument("--grace", type=float, default=60.0, metavar="S",
                   help="reconcile: a copy without a final state older than this is "
                        "unaccounted (default 60 s)")
    p.add_argument("--window", type=int, default=60, metavar="MIN",
                   help="reconcile: window width in minutes (default 60)")
    p.add_argument("--producer-key", choices=("auto", "producer", "app_id"), default="auto",
                   help="sequence: the producer is header x-producer, app_id, or the first "
                        "of them present (auto, default)")
    p.add_argument("--message-id", default=None, help="track: a message_id property")
    p.add_argument("--ref-key", default=None, help="track: an x-ref-key header")
    p.add_argument("--msg", type=int, default=None, help="track: the broker's message id")
    p.add_argument("--consumer", default=None, help="track: a consumer tag")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    f = p.add_argument_group("reconcile --follow: a trail in a stream (broker --audit-stream)")
    f.add_argument("--follow", default=None, metavar="STREAM",
                   help="reconcile continuously, in micro-batches, the trail the broker "
                        "appends to STREAM; stops on SIGINT")
    f.add_argument("--stream-host", default="127.0.0.1")
    f.add_argument("--stream-port", type=int, default=5552, help="the Stream protocol port")
    f.add_argument("--stream-vhost", default="/")
    f.add_argument("--stream-user", default="guest")
    f.add_argument("--stream-password", default=os.environ.get("TRIOMQ_STREAM_PASSWORD", "guest"),
                   help="default: $TRIOMQ_STREAM_PASSWORD, else guest")
    f.add_argument("--trigger", type=float, default=5.0, metavar="S",
                   help="seconds between micro-batches (default 5)")
    return p


class Progress:
    """``spark.audit: <what> (<s> s)`` lines on stderr while a job runs."""

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.started = time.monotonic()

    def __call__(self, what: str) -> None:
        if not self.quiet:
            print(f"spark.audit: {what} ({time.monotonic() - self.started:.1f} s)",
                  file=sys.stderr, flush=True)


def warn(what: str) -> None:
    print(f"spark.audit: warning: {what}", file=sys.stderr, flush=True)


def require_pyspark() -> None:
    """BadInput with the extra to install when the jobs' libraries are missing."""
    missing = []
    for module in ("pyspark", "pyarrow", "pandas"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise BadInput(f"{', '.join(missing)} not installed; {INSTALL_HINT}")


def _local_path(path: str) -> str | None:
    u = urlparse(path)
    if u.scheme in ("", "file"):
        return u.path if u.scheme else path
    return None


def check_input(path: str) -> None:
    local = _local_path(path)
    if local is None:
        return  # remote: Spark finds out (an empty listing is reported after loading)
    if not os.path.exists(local):
        raise BadInput(f"--input {path}: no such file or directory")
    found = [local] if os.path.isfile(local) else [
        os.path.join(d, f) for d, _dirs, files in os.walk(local) for f in files
        if f.endswith(".avro")]
    if not found:
        raise BadInput(f"--input {path}: no audit files (*.avro) there")
    from broker.audit.events import SCHEMA_VERSION
    from broker.audit.reader import VERSION_KEY, _header
    for name in found:  # an unknown schema version stops the job before Spark starts
        with open(name, "rb") as f:
            head = f.read(1 << 16)
        try:
            meta = _header(head)[0]
            version = int(meta.get(VERSION_KEY, b"1").decode() or 1)
        except (ValueError, IndexError, UnicodeDecodeError):
            continue  # damaged: the reader skips it and reports it
        if version > SCHEMA_VERSION:
            raise BadInput(f"{name}: audit schema version {version} is newer than this "
                           f"reader's ({SCHEMA_VERSION}); upgrade the jobs")


def _empty_files(path: str) -> list[tuple]:
    """Problems for the local input's empty ``*.avro`` files, which Spark's listing leaves
    out: a file the writer opened for a batch that never reached the disk."""
    local = _local_path(path)
    if local is None or not os.path.isdir(local):
        return []
    return [(os.path.join(d, f), 0, "bad header", "empty file (0 bytes)")
            for d, _dirs, files in sorted(os.walk(local)) for f in sorted(files)
            if f.endswith(".avro") and os.path.getsize(os.path.join(d, f)) == 0]


def _package_zip() -> str:
    """spark/ and broker/audit/ zipped, for the executors of a cluster (--py-files)."""
    fd, path = tempfile.mkstemp(prefix="triomq-audit-", suffix=".zip")
    os.close(fd)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("broker/__init__.py", "")
        for pkg in ("spark", os.path.join("broker", "audit")):
            for dirpath, _dirs, files in os.walk(os.path.join(ROOT, pkg)):
                for f in files:
                    if f.endswith((".py", ".avsc")):
                        full = os.path.join(dirpath, f)
                        z.write(full, os.path.relpath(full, ROOT))
    return path


def spark_session(master: str | None = None, app: str = "triomq-audit"):
    """A session for the jobs; local[*] unless ``master`` says otherwise."""
    os.environ["PYTHONPATH"] = ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                       if os.environ.get("PYTHONPATH") else "")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if not master or master.startswith("local"):
        # the driver binds loopback (no "hostname resolves to a loopback address" warning)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    log4j = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
    builder = SparkSession.builder.appName(app).master(master or "local[*]")
    if os.path.exists(log4j):
        # Spark's own log at ERROR from the JVM's start (setLogLevel comes too late for the
        # start-up warnings)
        builder = builder.config("spark.driver.extraJavaOptions",
                                 f"-Dlog4j2.configurationFile=file:{log4j}")
    builder = (builder
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.sql.files.maxPartitionBytes", str(16 << 20))
               # local mode: the driver is the executor, and the cache of a 10 M-event
               # trail's columns with the queue copies did not fit 2g (old generation full,
               # blocks spilled)
               .config("spark.driver.memory", "4g"))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    if master and not master.startswith("local"):
        spark.sparkContext.addPyFile(_package_zip())
    return spark


def run_job(spark, job: str, args, out: str, progress=None) -> tuple[dict, int]:
    """Run ``job`` (or all of them for ``report``); write its outputs under ``out``.
    Returns (summary, exit status)."""
    from . import integrity, jobs, report
    from .source import COLUMNS, Trail
    progress = progress or Progress(True)
    todo = ("reconcile", "sequence", "latency", "deadletters") if job == "report" else (job,)
    wanted: set = set()
    for name in todo:
        wanted.update(jobs.COLUMNS.get(name, COLUMNS))
    trail = Trail(spark, args.input, [c for c in COLUMNS if c in wanted],
                  from_us=args.from_us, to_us=args.to_us)
    ev = trail.df.cache()
    started = time.monotonic()
    from pyspark.sql import functions as F
    progress("reading the trail")
    n, first_ts, last_ts = ev.agg(F.count(F.lit(1)), F.min("ts_us"), F.max("ts_us")).first()
    trail.check_versions()
    if n == 0 and not trail.problems() and not _empty_files(args.input) \
            and trail.files.limit(1).count() == 0:
        raise BadInput(f"--input {args.input}: no audit files (*.avro) there")
    blocks = trail.blocks()
    empty = _empty_files(args.input)
    gaps = integrity.gaps(blocks, trail.problems() + empty, args.from_us, args.to_us)
    progress(f"read {n} events of {len(blocks)} blocks")
    if n == 0:
        span = (f"the trail's blocks start from {_iso(min(b[5] for b in blocks))} to "
                f"{_iso(max(b[5] for b in blocks))}" if blocks else "no readable block")
        warn(f"no events in the range [{_iso(args.from_us)}, {_iso(args.to_us)}) of "
             f"{args.input}; {span}")
    summaries: dict = {}
    status = 0
    read_seconds = round(time.monotonic() - started, 3)
    copies = jobs.queue_copies(ev).cache() if job in ("report", "reconcile", "latency",
                                                        "deadletters") else None
    window = (args.from_us if args.from_us is not None else first_ts,
              args.to_us if args.to_us is not None else last_ts)
    for name in todo:
        t0 = time.monotonic()
        progress(f"{name}")
        if name == "reconcile":
            tables, summary = jobs.reconcile(ev, args.window, args.grace,
                                             args.to_us or last_ts, copies, trail.seq_counts())
            if summary["unaccounted"]:
                status = 1
        elif name == "sequence":
            tables, summary = jobs.sequence(ev, args.producer_key)
            if summary["gaps"]:
                status = 1
        elif name == "latency":
            tables, summary = jobs.latency(ev, copies, window)
        elif name == "deadletters":
            tables, summary = jobs.deadletters(ev, copies)
        else:
            tables, summary = jobs.track(ev, args.message_id, args.ref_key, args.msg,
                                         args.consumer)
        for table, df in tables.items():
            df.coalesce(1).write.mode("overwrite").parquet(os.path.join(out, name, table))
        summary["seconds"] = round(time.monotonic() - t0, 3)
        summaries[name] = summary
    problems = trail.problems() + empty
    if gaps:
        status = EXIT_INCOMPLETE
    result = {
        "job": job, "input": args.input, "events": n,
        "from": args.from_us, "to": args.to_us,
        "read_seconds": read_seconds, "seconds": round(time.monotonic() - started, 3),
        "problems": [{"file": p[0], "offset": p[1], "kind": p[2], "detail": p[3]}
                     for p in problems],
        "incomplete": gaps,
        "exit_status": status, **summaries}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "summary.json" if job == "report" else f"{job}.json"), "w") as f:
        json.dump(result, f, indent=2, default=str)
    if job == "report":
        report.write_html(result, os.path.join(out, "report.html"))
    spark.catalog.clearCache()
    return result, status


def _follow(args, spark, progress) -> int:
    """reconcile --follow: until SIGINT (the handler is put back afterwards)."""
    import signal
    import threading

    from .follow import follow
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    own = spark is None
    try:
        if own:
            progress(f"starting Spark ({args.master or 'local[*]'}; the JVM takes a while)")
            spark = spark_session(args.master)
        progress(f"following stream {args.follow!r} on {args.stream_host}:{args.stream_port} "
                 f"(SIGINT stops)")
        status = follow(spark, args, stop, lambda text: print(text, flush=True))
        progress("stopped")
        return status
    finally:
        signal.signal(signal.SIGINT, previous)
        if own and spark is not None:
            spark.stop()


def _iso(us: int | None) -> str:
    if us is None:
        return "-"
    t = datetime.datetime.fromtimestamp(us / 1e6, datetime.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def main(argv: list[str] | None = None, spark=None) -> int:
    """The CLI; ``spark``: a session to use (and leave running) instead of starting one."""
    args = build_parser().parse_args(argv)
    progress = Progress(args.quiet)
    try:
        args.from_us = parse_time(args.from_, "--from") if args.from_ else None
        args.to_us = parse_time(args.to, "--to") if args.to else None
        if args.from_us is not None and args.to_us is not None and args.from_us >= args.to_us:
            raise BadInput(f"--from {args.from_} is not before --to {args.to}")
        require_pyspark()
        if args.follow:
            if args.job != "reconcile":
                raise BadInput("--follow is for the reconcile job")
            return _follow(args, spark, progress)
        if not args.input:
            raise BadInput("--input is required (or reconcile --follow STREAM)")
        check_input(args.input)
        own = spark is None
        if own:
            progress(f"starting Spark ({args.master or 'local[*]'}; the JVM takes a while)")
            spark = spark_session(args.master)
        try:
            result, status = run_job(spark, args.job, args, args.output, progress)
        finally:
            if own:
                spark.stop()
    except BadInput as exc:
        print(f"spark.audit: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:
        from .source import SchemaVersionError
        if isinstance(exc, SchemaVersionError):
            print(f"spark.audit: error: {exc}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
    from .integrity import line as gap_line
    for p in result["problems"]:
        warn(f"damaged input skipped: {p['file']} @ {p['offset']}: {p['kind']} ({p['detail']})")
    for gap in result["incomplete"]:
        print(f"spark.audit: error: trail incomplete: {gap_line(gap)}", file=sys.stderr)
    line = f"{args.job}: {result['events']} events in {result['seconds']} s"
    if result["incomplete"]:
        line += (f"; TRAIL INCOMPLETE: {len(result['incomplete'])} gap(s) in the sequence "
                 f"(exit status {EXIT_INCOMPLETE})")
    if result["problems"]:
        line += f"; {len(result['problems'])} damaged block(s)/file(s) skipped (see summary)"
    if "reconcile" in result:
        line += (f"; unaccounted: {result['reconcile']['unaccounted']}; still queued at the "
                 f"end: {result['reconcile']['still_queued_at_end']}")
    if "sequence" in result:
        line += f"; missing x-seq: {result['sequence']['missing']}"
    print(line)
    return status
