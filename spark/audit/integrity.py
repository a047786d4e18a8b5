"""Is the trail whole? Judged from its own sequence numbers, not from the events' meaning.

Every node numbers its events 1, 2, 3 ... without a gap (continued across restarts), and the
writer makes each Avro block one run of that sequence, so the blocks read (``Trail.blocks``:
path, offset, node, first seq, count, first ts_us, whatever the time range) show what is
missing:

- a *hole*: seq numbers between two blocks of a node that no block has. Named by where it
  is: inside one file (damaged blocks skipped there), after a file's torn tail, at a file
  that could not be read at all, or a missing file between two named ones;
- a *lost end*: a node's newest file ends torn or damaged after its last good block, or a
  file newer than that block could not be read: the events from the next seq on are not in
  the trail (the broker converts them again at its next start if its spool still has them).

Damage that loses nothing (a torn tail whose events the converter wrote again into the next
file, an empty file in the middle) is reported as a problem but leaves the trail whole.
What cannot be seen: files missing at a node's very end with nothing damaged, or before its
first file read (a trail may start anywhere: old files are deleted by retention).

With ``--from``/``--to`` a hole counts only if it may hold events of the range: the block
after it starts at or after ``from`` and the block before it before ``to``.
"""
from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlparse

_PART = re.compile(r"part-(\d+)\.avro$")
_NODE = re.compile(r"(?:^|/)node=([^/]+)/")


def _local(uri: str) -> str:
    """A local file's path for a ``file:`` URI (as Spark lists them); others unchanged."""
    u = urlparse(uri)
    return unquote(u.path) if u.scheme == "file" else uri


def _name_seq(path: str) -> int | None:
    m = _PART.search(path)
    return int(m.group(1)) if m else None


def _node_of(path: str) -> str | None:
    m = _NODE.search(path)
    return m.group(1) if m else None


def gaps(blocks: list, problems: list, from_us: int | None = None,
         to_us: int | None = None) -> list[dict]:
    """What the trail lacks: ``{"node", "from_seq", "to_seq" (None: to the end),
    "missing" (None: unknown), "file", "why"}`` per hole or lost end, in node and seq
    order. ``blocks``: ``(path, offset, node, first seq, count, first ts_us)``;
    ``problems``: ``(path, offset, kind, detail)``."""
    damaged: dict[str, list] = {}
    for path, offset, kind, detail in problems:
        damaged.setdefault(path, []).append((offset, kind, detail))
    by_node: dict[str, list] = {}
    for path, offset, node, first, count, ts in blocks:
        by_node.setdefault(node, []).append((first, first + count - 1, path, offset, ts))
    unreadable = {p: d for p, d in damaged.items() if any(k == "bad header" for _, k, _ in d)}
    out: list[dict] = []

    def name(path: str) -> str:
        return _local(path)

    def describe(path: str, after: int | None = None) -> str | None:
        """Damage of ``path`` (after byte ``after``), as one phrase."""
        found = [(o, k, d) for o, k, d in damaged.get(path, []) if after is None or o > after]
        if not found:
            return None
        o, k, d = found[0]
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        return f"{k} at byte {o} ({d}){more}"

    for node in sorted(by_node):
        spans = sorted(by_node[node])
        end = None
        prev = None
        for first, last, path, offset, ts in spans:
            if end is not None and first > end + 1:
                p_first, p_last, p_path, p_offset, p_ts = prev
                relevant = (from_us is None or ts >= from_us) and (to_us is None or p_ts < to_us)
                if relevant:
                    out.append(_hole(node, end + 1, first - 1, p_path, p_offset, path, unreadable,
                                     describe, name))
            if end is None or last > end:
                end, prev = last, (first, last, path, offset, ts)
        # the node's end: damage after its last good block, or unreadable newer files
        last_first, last_seq, last_path, last_offset, last_ts = prev
        if to_us is not None and last_ts >= to_us:
            continue  # the range ends before the trail's last block
        torn = describe(last_path, last_offset)
        newer = sorted(p for p in unreadable
                       if _node_of(name(p)) == node and (_name_seq(p) or 0) > last_seq)
        if torn or newer:
            why = []
            if torn:
                why.append(f"{name(last_path)}: {torn} after its last good block")
            why += [f"{name(p)}: unreadable ({describe(p)})" for p in newer]
            out.append({"node": node, "from_seq": last_seq + 1, "to_seq": None, "missing": None,
                        "file": name(newer[-1] if newer else last_path),
                        "why": "; ".join(why)})
    # unreadable files of nodes no block was read of
    seen = set(by_node)
    for path in sorted(unreadable):
        node = _node_of(name(path))
        if node is not None and node in seen:
            continue
        out.append({"node": node, "from_seq": _name_seq(path), "to_seq": None, "missing": None,
                    "file": name(path), "why": f"unreadable ({describe(path)})"})
    return out


def _hole(node, lo, hi, p_path, p_offset, path, unreadable, describe, name) -> dict:
    if p_path == path:
        why = describe(path, p_offset) or "blocks missing inside the file"
        where = name(path)
    else:
        inside = sorted(p for p in unreadable if _node_of(name(p)) == node
                        and lo <= (_name_seq(p) or -1) <= hi)
        torn = describe(p_path, p_offset)
        parts = []
        if torn:
            parts.append(f"{name(p_path)}: {torn}")
        parts += [f"{name(p)}: unreadable ({describe(p)})" for p in inside]
        if parts:
            why = "; ".join(parts)
            where = name(inside[0]) if inside else name(p_path)
        else:
            why = (f"no file holds them: between {os.path.basename(name(p_path))} and "
                   f"{os.path.basename(name(path))} (a file missing)")
            where = os.path.dirname(name(path))
    return {"node": node, "from_seq": lo, "to_seq": hi, "missing": hi - lo + 1, "file": where,
            "why": why}


def line(gap: dict) -> str:
    """One line naming a gap, for stderr."""
    seqs = (f"seq {gap['from_seq']}-{gap['to_seq']} ({gap['missing']} events)"
            if gap["to_seq"] is not None else f"seq {gap['from_seq']} onwards")
    return f"node {gap['node']}: {seqs} missing: {gap['why']}"
