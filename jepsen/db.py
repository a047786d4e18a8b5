"""A throw-away PostgreSQL database per run (the machine's server, trust auth)."""
from __future__ import annotations

import secrets


class PgDatabase:
    def __init__(self, host: str = "127.0.0.1", port: int = 5432, user: str = "postgres"):
        import psycopg
        self._psycopg = psycopg
        self.host, self.port, self.user = host, port, user
        self.name = "triomq_jepsen_" + secrets.token_hex(6)
        self._admin(f'CREATE DATABASE "{self.name}"')
        self.url = f"postgresql+psycopg://{user}@{host}:{port}/{self.name}"

    def _admin(self, sql: str) -> None:
        with self._psycopg.connect(host=self.host, port=self.port, user=self.user,
                                   dbname="postgres", autocommit=True, connect_timeout=5) as c:
            c.execute(sql)

    def drop(self) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
