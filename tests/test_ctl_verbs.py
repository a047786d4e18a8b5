"""``python -m broker ctl``: the verbs and flags rabbitmqctl and rabbitmq-queues have that ctl
lacked, run as a subprocess against an in-process broker (outputs and exit statuses as
RabbitMQ 3.10's, checked by hand against the machine's rabbitmqctl; docs/management.md)."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import threading
from pathlib import Path

import pika
import trio

from tests.management.conftest import start_http_broker

REPO = Path(__file__).resolve().parent.parent


async def ctl(hb, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python -m broker ctl ...``'s entry point run in a worker thread with its own stdin,
    stdout and stderr: the same parser, verbs, output and exit status as the command, without
    an interpreter start per verb (31 of them took two minutes of the CI run).
    ``ctl_subprocess`` runs one as the real command, to keep the process edge tested."""
    return await trio.to_thread.run_sync(_ctl_in_process, ["ctl", "--url", hb.url, *args], stdin)


_STDIO = threading.Lock()  # sys.stdin/stdout/stderr are the process's: one verb at a time


def _ctl_in_process(argv: list[str], stdin: str | None) -> subprocess.CompletedProcess:
    from broker.cli import main

    out, err = io.StringIO(), io.StringIO()
    with _STDIO, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        saved, sys.stdin = sys.stdin, io.StringIO(stdin or "")
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse and the usage errors (64) leave this way
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            sys.stdin = saved
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


async def ctl_subprocess(hb, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "broker", "ctl", "--url", hb.url, *args]
    return await trio.to_thread.run_sync(lambda: subprocess.run(
        cmd, cwd=str(REPO), capture_output=True, text=True, timeout=120))


async def test_ctl_verbs(nursery, tmp_path):
    hb = await start_http_broker(nursery, tmp_path)
    try:
        await _checks(hb)
    finally:
        await hb.server.shutdown()


async def _checks(hb) -> None:
    params = pika.ConnectionParameters("127.0.0.1", hb.amqp_port,
                                       client_properties={"connection_name": "ctl-test"})
    conn = await trio.to_thread.run_sync(pika.BlockingConnection, params)
    try:
        ch = await trio.to_thread.run_sync(conn.channel)
        await trio.to_thread.run_sync(lambda: ch.queue_declare(
            "qq", durable=True, arguments={"x-queue-type": "quorum"}))

        # list_channels: rabbitmqctl's banner, default columns, -s and --no-table-headers
        p = await ctl(hb, "list_channels")
        lines = p.stdout.splitlines()
        assert p.returncode == 0 and lines[:2] == [
            "Listing channels ...", "pid\tuser\tconsumer_count\tmessages_unacknowledged"]
        assert lines[2].endswith(" (1)\tguest\t0\t0"), lines
        p = await ctl(hb, "list_channels", "-s", "number", "user", "confirm")
        assert p.stdout.splitlines() == ["1\tguest\tfalse"], p.stdout
        p = await ctl(hb, "list_channels", "--no-table-headers", "number")
        assert p.stdout.splitlines() == ["Listing channels ...", "1"]
        assert (await ctl(hb, "list_channels", "bogus")).returncode == 64

        # export_definitions -: JSON only (``| jq``)
        p = await ctl(hb, "export_definitions", "-")
        assert p.returncode == 0
        assert any(q["name"] == "qq" for q in json.loads(p.stdout)["queues"])

        p = await ctl_subprocess(hb, "cluster_status")  # the command itself, once
        assert p.returncode == 0 and "Cluster name: triomq@localhost" in p.stdout
        assert "Running Nodes\n\ntriomq@localhost" in p.stdout
        from broker import __version__
        assert (await ctl(hb, "version")).stdout.strip() == __version__
        p = await ctl(hb, "await_startup")
        assert p.returncode == 0 and p.stdout == ""
        p = await ctl(hb, "--url", "http://127.0.0.1:9", "await_startup", "--timeout", "0.5")
        assert p.returncode == 69
        p = await ctl(hb, "--formatter", "json", "environment")
        env = json.loads(p.stdout)
        assert env["http_port"] == 0 and env["default_pass"] == "********"

        # operator policies, parameters, limits
        p = await ctl(hb, "set_operator_policy", "op", "^q", '{"max-length": 5}',
                      "--apply-to", "queues")
        assert p.returncode == 0, p.stderr
        p = await ctl(hb, "-q", "list_operator_policies")
        assert p.stdout.splitlines()[0] == "vhost\tname\tpattern\tapply-to\tdefinition\tpriority"
        assert p.stdout.splitlines()[1].startswith("/\top\t^q\tqueues\t")
        assert (await ctl(hb, "clear_operator_policy", "op")).returncode == 0
        assert (await ctl(hb, "-s", "list_operator_policies")).stdout == ""
        p = await ctl(hb, "-s", "list_global_parameters")
        assert p.stdout.splitlines() == ['cluster_name\t"triomq@localhost"']
        assert (await ctl(hb, "set_vhost_limits", '{"max-connections": 10}')).returncode == 0
        p = await ctl(hb, "-q", "list_vhost_limits")
        assert p.stdout.strip() == '{"max-connections":10}'
        p = await ctl(hb, "-s", "list_parameters")
        assert p.stdout.splitlines() == ['vhost-limits\tlimits\t{"max-connections":10}']
        assert (await ctl(hb, "clear_vhost_limits")).returncode == 0
        assert (await ctl(hb, "-q", "list_vhost_limits")).stdout == ""
        assert (await ctl(hb, "set_user_limits", "guest", '{"max-channels": 4}')).returncode == 0
        p = await ctl(hb, "-q", "list_user_limits", "guest")
        assert p.stdout.strip() == '{"max-channels":4}'
        assert (await ctl(hb, "clear_user_limits", "guest", "all")).returncode == 0
        assert (await ctl(hb, "-q", "list_user_limits", "guest")).stdout.strip() == "{}"

        # rabbitmq-queues' verbs on the one node
        p = await ctl(hb, "-q", "quorum_status", "qq")
        assert p.returncode == 0 and p.stdout.splitlines() == [
            "Node Name\tRaft State\tLog Index\tCommit Index\tSnapshot Index\tTerm\t"
            "Machine Version",
            "triomq@localhost\tleader\tundefined\tundefined\tundefined\t1\tundefined"]
        assert (await ctl(hb, "quorum_status", "nope")).returncode == 69
        assert (await ctl(hb, "add_member", "qq", "triomq@localhost")).returncode == 0
        p = await ctl(hb, "delete_member", "qq", "triomq@localhost")
        assert p.returncode == 69 and "last_node" in p.stderr
        assert (await ctl(hb, "grow", "triomq@localhost", "all")).returncode == 0
        p = await ctl(hb, "-s", "shrink", "triomq@localhost")
        assert p.stdout.splitlines() == ["/\tqq\t1\terror: the last node cannot be removed"]
    finally:
        await trio.to_thread.run_sync(conn.close)
