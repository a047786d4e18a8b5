"""Names and keys as the SQL store writes them in its text columns.

A name (vhost, exchange, queue, routing key, metadata key) is any string the broker
holds: RabbitMQ accepts NUL in a shortstr, and a non-UTF-8 byte arrives as a
surrogate (``surrogateescape``). PostgreSQL's text types cannot hold NUL, and no
driver encodes a lone surrogate, so those characters are written as characters of a
reserved block of the Private Use Area (U+F700..U+F7FF), one for one:

  NUL                      -> U+F700
  U+DC80..U+DCFF (a byte)  -> U+F780..U+F7FF
  a character of the block -> U+F701 + that character
  any other lone surrogate -> U+F702 + U+F000..U+F7FF (its offset from U+D800)

A name without these characters is stored unchanged (what older versions wrote), and
no name grows past its wire size: an escaped NUL or byte is one character for one
byte, a character of the block (three bytes) two characters, so a shortstr (255
bytes) still fits ``VARCHAR(255)``. Schema v4 (``sql_schema.migrate``) rewrote the
rare older rows that held NUL or a character of the block.
"""
from __future__ import annotations

import re
from typing import cast

_NUL, _LIT, _SUR = "\uf700", "\uf701", "\uf702"
_NEEDS = re.compile("[\x00\ud800-\udfff\uf700-\uf7ff]")
_ESCAPED = re.compile("\uf701(.)|\uf702(.)|([\uf700\uf780-\uf7ff])", re.DOTALL)


def _enc(m: re.Match[str]) -> str:
    c = m.group()
    o = ord(c)
    if o == 0:
        return _NUL
    if 0xDC80 <= o <= 0xDCFF:
        return chr(0xF700 + o - 0xDC00)
    if 0xF700 <= o <= 0xF7FF:
        return _LIT + c
    return _SUR + chr(0xF000 + o - 0xD800)


def _dec(m: re.Match[str]) -> str:
    lit, sur, one = m.groups()
    if lit is not None:
        return cast(str, lit)
    if sur is not None:
        return chr(0xD800 + ord(sur) - 0xF000)
    return "\0" if one == _NUL else chr(0xDC00 + ord(one) - 0xF700)


def db_name(name: str) -> str:
    """``name`` as written to a text column (unchanged unless it needs escaping)."""
    if name.isascii() and "\0" not in name:
        return name
    return _NEEDS.sub(_enc, name)


def from_db(text: str) -> str:
    """The name a text column holds (``db_name`` undone)."""
    if text.isascii():
        return text
    return _ESCAPED.sub(_dec, text)


def needs_escape(text: str) -> bool:
    """True if ``text``, read from a column written before v4, is not stored as v4 would."""
    return _NEEDS.search(text) is not None
