"""A publish through Hermes' own listener (``--hermes-port``) is recorded in the audit trail
with the user who authenticated and the client's address, as one on the management port
(a real broker process, httpx, the Avro files read back)."""
from __future__ import annotations

import httpx
import pytest

from .test_mqtt_trail import Broker, _port, _wait_port, hermes_topic


@pytest.mark.timeout(120)
def test_frontend_publish_records_the_user(tmp_path):
    hermes_port = _port()
    b = Broker(tmp_path, "--hermes-port", str(hermes_port))
    try:
        _wait_port(b.proc, hermes_port)
        admin = httpx.Client(base_url=f"http://127.0.0.1:{b.http_port}", auth=("guest", "guest"))
        hermes_topic(admin, "shop.front", "JSON")
        r = admin.put("/api/users/front-user", json={"password": "pw", "tags": ""})
        assert r.status_code in (201, 204), r.text
        r = admin.put("/api/permissions/%2F/front-user",
                      json={"configure": "", "write": ".*", "read": ""})
        assert r.status_code in (201, 204), r.text
        front = httpx.Client(base_url=f"http://127.0.0.1:{hermes_port}", auth=("front-user", "pw"))
        r = front.post("/topics/shop.front", content=b'{"id": 7}',
                       headers={"content-type": "application/json"})
        assert r.status_code in (201, 202), r.text
        mid = r.headers["Hermes-Message-Id"]
    finally:
        records = b.stop()
    [pub] = [r for r in records if r["event"] == "published"]
    assert (pub["exchange"], pub["message_id"], pub["user"], pub["connection"],
            pub["outcome"], pub["queues"]) == (
        "shop.front", mid, "front-user", "127.0.0.1", "routed", ["shop.front.s"])
