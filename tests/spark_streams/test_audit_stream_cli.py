"""``triomq run --audit-stream`` on the command line: one clear error line, nothing started."""
from __future__ import annotations

from broker.cli import main


def test_audit_stream_needs_the_trail(tmp_path, capsys):
    capsys.readouterr()
    code = main(["run", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
                 "--stream-port", "0", "--data-dir", str(tmp_path / "d"), "--store", "memory",
                 "--audit-stream", "audit"])
    assert code == 2
    assert capsys.readouterr().err == ("triomq: error: --audit-stream needs --audit-dir (the "
                                       "stream is a copy of the trail)\n")
