"""Security options on the command line: bad input is one clear line and exit status 2."""
from __future__ import annotations

import json

import pytest

from broker.cli import _loopback_users, main


@pytest.mark.parametrize("content,message", [
    (None, "--load-definitions {path}: file: No such file or directory"),
    ("{not json", "file: not valid JSON"),
    (json.dumps({"users": [{"name": "a", "password": "p", "tags": "root"}]}),
     "users[0].tags: unknown tag 'root'"),
    (json.dumps({"permissions": [{"user": "ghost", "vhost": "/", "configure": ".*",
                                  "write": ".*", "read": ".*"}]}),
     "permissions[0].user: no such user 'ghost'"),
])
def test_bad_definitions_file(tmp_path, capsys, content, message):
    path = tmp_path / "defs.json"
    if content is not None:
        path.write_text(content)
    code = main(["run", "--port", "0", "--data-dir", str(tmp_path / "d"), "--store", "memory",
                 "--load-definitions", str(path)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message.format(path=path) in err and len(err.splitlines()) == 1, err


def test_empty_default_user_and_loopback_list(tmp_path, capsys):
    assert main(["run", "--data-dir", str(tmp_path), "--default-user", ""]) == 2
    assert "--default-user must not be empty" in capsys.readouterr().err
    assert _loopback_users("none") == () and _loopback_users(" a, b ,") == ("a", "b")
