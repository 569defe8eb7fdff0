"""The results store's SQLite layout: its tables, the migration of stores written before a
column existed, and the query that reads the rows of the current units
(:mod:`.store` writes and reads through them)."""

from __future__ import annotations

import sqlite3

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS variants (
    name TEXT PRIMARY KEY, label TEXT, position INTEGER,
    spec_json TEXT, overrides_json TEXT, warnings_json TEXT);
CREATE TABLE IF NOT EXISTS units (
    key TEXT PRIMARY KEY, variant TEXT, seed INTEGER, probe TEXT, settings_json TEXT,
    status TEXT CHECK (status IN ('ok', 'failed')), error TEXT, traceback TEXT,
    started_at TEXT, finished_at TEXT, duration_s REAL, version TEXT, device TEXT,
    invocation TEXT, cpu_s REAL, load_start REAL, load_end REAL, torch_threads INTEGER,
    cores INTEGER, machine TEXT);
CREATE TABLE IF NOT EXISTS rows (
    unit_key TEXT NOT NULL REFERENCES units(key), probe TEXT, metric TEXT, scope TEXT,
    name TEXT, layer INTEGER, step INTEGER, value REAL, unit TEXT);
CREATE INDEX IF NOT EXISTS rows_by_unit ON rows(unit_key);
CREATE TABLE IF NOT EXISTS plan (
    key TEXT NOT NULL, variant TEXT, seed INTEGER, probe TEXT, position INTEGER,
    PRIMARY KEY (variant, seed, probe));
CREATE INDEX IF NOT EXISTS plan_by_key ON plan(key);
"""

#: units columns added after the first stores were written: name -> SQL type. An older store
#: opened to write gets them added; one read only has them read as missing.
ADDED_UNIT_COLUMNS = {"invocation": "TEXT", "cpu_s": "REAL", "load_start": "REAL",
                      "load_end": "REAL", "torch_threads": "INTEGER", "cores": "INTEGER",
                      "machine": "TEXT"}


def add_missing_columns(conn: sqlite3.Connection) -> None:
    """Migrate a store written before :data:`ADDED_UNIT_COLUMNS` existed (a read-only one is
    left as it is; its units read back with those missing)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(units)")}
    for name, sql_type in ADDED_UNIT_COLUMNS.items():
        if name not in have:
            try:
                conn.execute(f"ALTER TABLE units ADD COLUMN {name} {sql_type}")
            except sqlite3.OperationalError:
                pass


#: every row of the current units (``{current}``: the condition on the plan's key), and one
#: ``error`` row per failed unit, in plan order then as written
ROWS_SQL = """
    SELECT COALESCE(p.variant, u.variant) AS variant, COALESCE(p.seed, u.seed) AS seed,
           r.probe, r.metric, r.scope, r.name, r.layer, r.step, r.value, r.unit,
           u.key AS unit_key, u.status, u.error,
           COALESCE(p.position, 1e18) AS _pos, r.rowid AS _rid
    FROM units u
    JOIN rows r ON r.unit_key = u.key
    LEFT JOIN plan p ON p.key = u.key
    WHERE u.status = 'ok' AND {current}
    UNION ALL
    SELECT COALESCE(p.variant, u.variant), COALESCE(p.seed, u.seed), u.probe, 'error',
           'model', '', NULL, NULL, NULL, '', u.key, u.status, u.error,
           COALESCE(p.position, 1e18), 0
    FROM units u
    LEFT JOIN plan p ON p.key = u.key
    WHERE u.status = 'failed' AND {current}
    ORDER BY _pos, _rid
"""


__all__ = ["ADDED_UNIT_COLUMNS", "ROWS_SQL", "SCHEMA", "add_missing_columns"]
