"""PostgreSQL for the tests: the cluster `.ci/run` starts (scripts/postgres.sh), found through
RESPD_TEST_POSTGRES_DSN. Each test gets its own schema, so tests never see each other's rows.

Without the variable the PostgreSQL tests fail under CI (CI must provide the database) and
skip elsewhere, saying how to start one."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

import psycopg
import pytest

ENV = "RESPD_TEST_POSTGRES_DSN"


def postgres_dsn() -> str:
    dsn = os.environ.get(ENV)
    if dsn:
        return dsn
    if os.environ.get("CI"):
        pytest.fail(f"{ENV} is not set: .ci/run starts PostgreSQL with scripts/postgres.sh")
    pytest.skip(f'PostgreSQL tests need {ENV}: eval "$(scripts/postgres.sh start)"')


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A DSN whose connections work in a new, empty schema (dropped afterwards)."""
    base = postgres_dsn()
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {name}")
    try:
        sep = "&" if "?" in base else "?"
        yield f"{base}{sep}options={quote(f'-csearch_path={name}')}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {name} CASCADE")
