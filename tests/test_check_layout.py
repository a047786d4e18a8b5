"""``tools.check_layout`` (run by ``make lint``): a module over the size limit, a service
found with getattr on the broker and a feature constructor taking the whole broker are
reported with their place; the tree passes."""
from __future__ import annotations

from tools import check_layout


def _module(tmp_path, monkeypatch, text: str):
    monkeypatch.setattr(check_layout, "ROOT", tmp_path)
    path = tmp_path / "broker" / "feature.py"
    path.parent.mkdir()
    path.write_text(text)
    return path


def test_a_long_module_is_reported_once_the_size_rule_is_on(tmp_path, monkeypatch):
    path = _module(tmp_path, monkeypatch, "x = 1\n" * (check_layout.MAX_LINES + 1))
    found = check_layout.problems([path], check_lines=True)
    assert found == [f"broker/feature.py:1: {check_layout.MAX_LINES + 1} lines, over "
                     f"{check_layout.MAX_LINES}: split it by concept"]
    path.write_text("x = 1\n" * check_layout.MAX_LINES)
    assert check_layout.problems([path], check_lines=True) == []


def test_getattr_on_the_broker_is_reported_with_its_line(tmp_path, monkeypatch):
    path = _module(tmp_path, monkeypatch, "a = broker.access\n"
                                          "b = getattr(broker, 'recovery', None)\n"
                                          "c = getattr(self.broker, 'audit', None)\n"
                                          "d = getattr(config, 'tls_cert', None)\n")
    found = check_layout.problems([path])
    assert [p.split(": ")[0] for p in found] == ["broker/feature.py:2", "broker/feature.py:3"]


def test_a_feature_constructor_taking_the_broker_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(check_layout, "ROOT", tmp_path)
    path = tmp_path / "broker" / "scheduler" / "core.py"
    path.parent.mkdir(parents=True)
    path.write_text("class Scheduler:\n"
                    "    def __init__(self, services: SchedulerServices, clock=None):\n"
                    "        pass\n"
                    "class Held:\n"
                    "    def __init__(self, owner: 'broker.Broker | None'):\n"
                    "        pass\n"
                    "class Sink:\n"
                    "    def __init__(self, *, broker, name: str):\n"
                    "        pass\n"
                    "def install(broker: Broker, services: SchedulerServices) -> None:\n"
                    "    pass\n")
    found = check_layout.problems([path])
    assert found == [
        "broker/scheduler/core.py:5: Held() takes the broker (owner): hand it the services "
        "it uses (broker/services.py)",
        "broker/scheduler/core.py:8: Sink() takes the broker (broker): hand it the services "
        "it uses (broker/services.py)",
        "broker/scheduler/core.py:8: __init__() leaves its parameter broker unannotated: give "
        "it its type"]
    # outside the service-fed modules (a listener, the management API) it is not judged
    edge = tmp_path / "broker" / "listeners" / "x.py"
    edge.parent.mkdir()
    edge.write_text("class Edge:\n    def __init__(self, broker: Broker):\n        pass\n")
    assert check_layout.problems([edge]) == []


def test_policies_security_and_management_constructors_taking_the_broker_are_reported(
        tmp_path, monkeypatch):
    monkeypatch.setattr(check_layout, "ROOT", tmp_path)
    found = []
    for rel, cls in (("policies/registry.py", "Policies"), ("security/access.py", "AccessControl"),
                     ("management/http.py", "HttpServer"), ("management/stats.py", "Sampler")):
        path = tmp_path / "broker" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"class {cls}:\n    def __init__(self, broker: Broker):\n        pass\n")
        found += check_layout.problems([path])
    assert found == [
        f"broker/{rel}:2: {cls}() takes the broker (broker): hand it the services it uses "
        f"(broker/services.py)"
        for rel, cls in (("policies/registry.py", "Policies"),
                         ("security/access.py", "AccessControl"),
                         ("management/http.py", "HttpServer"), ("management/stats.py", "Sampler"))]


def test_a_cluster_constructor_taking_the_broker_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(check_layout, "ROOT", tmp_path)
    path = tmp_path / "broker" / "cluster" / "stream_replicas.py"
    path.parent.mkdir(parents=True)
    path.write_text("class _Follower:\n"
                    "    def __init__(self, owner: StreamReplicas, broker: Broker, vhost: str):\n"
                    "        pass\n"
                    "class _Copy:\n"
                    "    def __init__(self, services: StreamReplicaServices, vhost: str):\n"
                    "        pass\n")
    assert check_layout.problems([path]) == [
        "broker/cluster/stream_replicas.py:2: _Follower() takes the broker (broker): hand it "
        "the services it uses (broker/services.py)"]


def test_an_unannotated_broker_session_queue_or_vhost_parameter_is_reported(
        tmp_path, monkeypatch):
    monkeypatch.setattr(check_layout, "ROOT", tmp_path)
    path = tmp_path / "broker" / "listeners" / "edge.py"  # anywhere in broker/, the edge too
    path.parent.mkdir(parents=True)
    path.write_text("def install(broker) -> None:\n"
                    "    pass\n"
                    "class Hooks:\n"
                    "    def save_queue(self, vhost, queue: Queue, entry) -> None:\n"
                    "        pass\n"
                    "    async def close(self, *, session=None, reason: str = '') -> None:\n"
                    "        pass\n"
                    "    def typed(self, broker: Broker, session: Session, queue: Queue,\n"
                    "              vhost: 'VirtualHost | None', q, channel) -> None:\n"
                    "        pass\n"
                    "pick = lambda queue: queue.name\n")
    assert check_layout.problems([path]) == [
        "broker/listeners/edge.py:1: install() leaves its parameter broker unannotated: give "
        "it its type",
        "broker/listeners/edge.py:4: save_queue() leaves its parameter vhost unannotated: give "
        "it its type",
        "broker/listeners/edge.py:6: close() leaves its parameter session unannotated: give it "
        "its type"]


def test_the_tree_passes():
    assert check_layout.problems() == []
