"""The MQTT over WebSockets and $SYS options on the command line: one clear error line,
nothing started."""
from __future__ import annotations

import socket

import pytest

from broker.cli import main


def run(tmp_path, capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["run", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
                 "--data-dir", str(tmp_path / "d"), "--store", "memory", *args])
    return code, capsys.readouterr().err


def test_wss_without_certificate(tmp_path, capsys):
    code, err = run(tmp_path, capsys, "--mqtt-wss-port", "15676")
    assert code == 2
    assert err.strip() == "triomq: error: --mqtt-wss-port needs --tls-cert and --tls-key"


def test_wss_with_an_unreadable_certificate_names_its_option(tmp_path, capsys):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    code, err = run(tmp_path, capsys, "--mqtt-wss-port", "15676", "--tls-cert", str(bad),
                    "--tls-key", str(bad))
    assert code == 2
    assert err.startswith(f"triomq: error: --mqtt-wss-port: cannot load --tls-cert {bad}")


def test_invalid_ws_ports(tmp_path, capsys):
    for option in ("--mqtt-ws-port", "--mqtt-wss-port"):
        code, err = run(tmp_path, capsys, option, "70000", "--tls-cert", "c", "--tls-key", "k")
        assert code == 2
        assert err.strip() == f"triomq: error: invalid {option} 70000"


def test_ws_port_in_use(tmp_path, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(tmp_path, capsys, "--mqtt-ws-port", str(port))
    assert code == 1
    assert f"triomq: error: cannot listen for mqtt-ws on 127.0.0.1:{port}" in err
    assert "Traceback" not in err


def test_sys_interval_must_not_be_negative(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:  # argparse's own error
        run(tmp_path, capsys, "--mqtt-sys-interval", "-1")
    assert exc.value.code == 2
    assert "--mqtt-sys-interval: must be >= 0 (0: never): '-1'" in capsys.readouterr().err
