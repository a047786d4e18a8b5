"""The MQTT options on the command line: one clear error line, nothing started."""
from __future__ import annotations

import socket

from broker.cli import main


class Result:
    def __init__(self, returncode: int, stderr: str):
        self.returncode = returncode
        self.stderr = stderr


def run(tmp_path, capsys, *args) -> Result:
    """``triomq run`` in this process (the broker starts only if the options are valid)."""
    capsys.readouterr()
    code = main(["run", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
                 "--data-dir", str(tmp_path / "d"), "--store", "memory", *args])
    return Result(code, capsys.readouterr().err)


def test_mqtts_without_certificate(tmp_path, capsys):
    p = run(tmp_path, capsys, "--mqtts-port", "8883")
    assert p.returncode == 2
    assert p.stderr.strip() == "triomq: error: --mqtts-port needs --tls-cert and --tls-key"


def test_missing_certificate_file(tmp_path, capsys):
    p = run(tmp_path, capsys, "--mqtts-port", "8883", "--tls-cert", "/nonexistent.pem", "--tls-key", "k")
    assert p.returncode == 2
    assert p.stderr.strip() == "triomq: error: --tls-cert /nonexistent.pem: no such file"


def test_mqtt_port_in_use(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        p = run(tmp_path, capsys, "--mqtt-port", str(port))
    assert p.returncode == 1
    assert f"triomq: error: cannot listen for mqtt on 127.0.0.1:{port}" in p.stderr
    assert "Traceback" not in p.stderr


def test_invalid_mqtt_port(tmp_path, capsys):
    p = run(tmp_path, capsys, "--mqtt-port", "70000")
    assert p.returncode == 2
    assert p.stderr.strip() == "triomq: error: invalid --mqtt-port 70000"


def test_unreadable_certificate(tmp_path, capsys):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    p = run(tmp_path, capsys, "--mqtts-port", "8883", "--tls-cert", str(bad), "--tls-key", str(bad))
    assert p.returncode == 2
    assert p.stderr.startswith(f"triomq: error: --mqtts-port: cannot load --tls-cert {bad}")
