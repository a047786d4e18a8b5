"""``tools.check_layout`` (run by ``make lint``): a module over the size limit and a service
found with getattr on the broker are reported with their place; the tree passes."""
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


def test_the_tree_passes():
    assert check_layout.problems() == []
