"""Every ``docs/*.md`` that the tree names exists (``make lint``).

Looks through the tracked and new files (code, comments, docs, README, the Makefile) for
``docs/<name>.md``, and in Markdown files also for relative links (``[x](durability.md)``,
resolved from the linking file's folder). Prints ``file:line: ...`` for each missing one and
exits 1. Runs ``tools.check_layout`` too (module size, no getattr on the broker), so
``make lint`` holds both."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMED = re.compile(r"(?<![\w/.-])docs/[\w./-]*?\.md\b")
LINK = re.compile(r"\]\(([^)#\s:]+\.md)(?:#[^)]*)?\)")
SKIP = (".venv/", "build/", "data/", "triomq.egg-info/")
TEXT = (".py", ".pyi", ".md", ".c", ".toml", ".cfg", ".txt", ".yml", ".yaml", ".sh", ".ini",
        ".rst", ".avsc", ".json", "Makefile")


def files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                         cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return sorted({f for f in out.splitlines()
                   if f.endswith(TEXT) and not f.startswith(SKIP)})


def missing(rel: str) -> list[str]:
    path = ROOT / rel
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return []
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in NAMED.finditer(line):
            if not (ROOT / m.group(0)).is_file():
                out.append(f"{rel}:{n}: {m.group(0)} does not exist")
        if rel.endswith(".md"):
            for m in LINK.finditer(line):
                target = (path.parent / m.group(1)).resolve()
                if not target.is_file() and not NAMED.fullmatch(m.group(1)):
                    out.append(f"{rel}:{n}: link {m.group(1)} does not exist")
    return out


def main() -> int:
    from . import check_layout
    problems = [p for f in files() for p in missing(f)] + check_layout.problems()
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
