"""A trail file decoded in byte-range shares by several Spark tasks gives the events of the
whole file once each, in order, and its damage once (spark/audit/source.py)."""
from __future__ import annotations

import itertools
import json

import pyarrow as pa

from broker.audit import events
from broker.audit.encoder import BatchEncoder, ContainerFile
from broker.audit.reader import FileReader
from spark.audit.source import COLUMNS, _decode_shares, _shares, seq_counts


class Collected(list):
    """What the tasks add to the problems accumulator (its ``add``)."""

    def add(self, items):
        self.extend(items)


def _trail_file(path, blocks: int = 12, per_block: int = 50) -> None:
    f = ContainerFile(str(path), json.dumps(events.load_schema()), "deflate", {})
    enc = BatchEncoder("n1", 1)
    t = 1_700_000_000.0
    for b in range(blocks):
        batch = [(events.PUB, t + b + i / 1000, "/", "x", "k", b * per_block + i,
                  {"message_id": f"m-{b}-{i}"}, 10, True, "guest", "c", 1, 0, ["q"], "routed")
                 for i in range(per_block)]
        f.write_block(len(batch), enc.encode(batch))
    f.close()


def test_shares_cover_every_block_once(tmp_path):
    path = tmp_path / "part-1.avro"
    _trail_file(path)
    data = bytearray(path.read_bytes())
    whole = FileReader(str(path), bytes(data))
    spans = list(whole._spans())
    # damage the 5th block's compressed data: a decoding problem inside one share
    at, p, size, _ = spans[4]
    data[p + size // 2:p + size // 2 + 8] = b"\xff" * 8
    path.write_bytes(bytes(data))
    uri = f"file://{path}"
    expected = FileReader(uri, bytes(data))
    rows = [r for block in expected.rows_iter(COLUMNS) for r in block]
    assert len(rows) == 11 * 50 and len(expected.problems) == 1
    shares = _shares([(uri, len(data))], 1 << 30, 5, least=1)
    assert len(shares) == 5 and shares[0][1] == 0 and shares[-1][2] == len(data)
    assert all(a[2] == b[1] for a, b in itertools.pairwise(shares))
    batch = pa.RecordBatch.from_pydict({"path": [s[0] for s in shares],
                                        "lo": [s[1] for s in shares],
                                        "hi": [s[2] for s in shares]})
    problems, runs = Collected(), Collected()
    out = list(_decode_shares(iter([batch]), COLUMNS, None, None, problems, runs))
    got = [tuple(r.values()) for b in out for r in b.to_pylist()]
    assert got == rows
    assert sorted(set(problems)) == [tuple(p) for p in expected.problems]
    assert expected.problems[0].offset == at
    # each good block is one run of sequence numbers, named by its offset; the damaged
    # block's 50 numbers are missing from the count
    assert sorted(r[1] for r in runs) == [s[0] for i, s in enumerate(spans) if i != 4]
    assert seq_counts(runs) == {"n1": 11 * 50}
    assert seq_counts(runs + runs) == {"n1": 11 * 50}  # a task run twice counts once


def test_seq_counts_union_and_fallback():
    runs = [("a", 1, "n1", 1, 100), ("b", 1, "n1", 51, 150), ("a", 9, "n1", 200, 200),
            ("a", 20, "n2", 5, 9)]
    assert seq_counts(runs) == {"n1": 151, "n2": 5}
    assert seq_counts([*runs, ("c", 1, None, 1, 3)]) is None
