"""The STOMP options on the command line: one clear error line, nothing started."""
from __future__ import annotations

import socket

import pytest

from broker.cli import build_parser, main


def run(tmp_path, capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["run", "--host", "127.0.0.1", "--port", "0", "--http-port", "0",
                 "--data-dir", str(tmp_path / "d"), "--store", "memory", *args])
    return code, capsys.readouterr().err.strip()


def test_stomp_port_without_a_value_is_61613():
    args = build_parser().parse_args(["run", "--stomp-port"])
    assert args.stomp_port == 61613
    assert build_parser().parse_args(["run"]).stomp_port is None  # no listener by default


@pytest.mark.parametrize("option", ["--stomps-port", "--stomp-wss-port"])
def test_tls_options_need_a_certificate(tmp_path, capsys, option):
    assert run(tmp_path, capsys, option, "61614") == (
        2, f"triomq: error: {option} needs --tls-cert and --tls-key")


def test_unreadable_certificate_names_the_stomp_option(tmp_path, capsys):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a certificate")
    code, err = run(tmp_path, capsys, "--stomps-port", "61614", "--tls-cert", str(bad),
                    "--tls-key", str(bad))
    assert code == 2
    assert err.startswith(f"triomq: error: --stomps-port: cannot load --tls-cert {bad}")


def test_invalid_and_busy_ports(tmp_path, capsys):
    assert run(tmp_path, capsys, "--stomp-ws-port", "70000") == (
        2, "triomq: error: invalid --stomp-ws-port 70000")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run(tmp_path, capsys, "--stomp-port", str(port))
    assert code == 1
    assert f"triomq: error: cannot listen for stomp on 127.0.0.1:{port}" in err
    assert "Traceback" not in err
