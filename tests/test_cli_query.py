"""``dilcompile query`` on hostile stores and hostile SQL: stored text never
reaches the terminal raw, and by default the SQL reads the store and nothing
else (``--allow-files`` opens the rest)."""

from __future__ import annotations

import contextlib
import json
import re

import pytest

duckdb = pytest.importorskip("duckdb")

from dilcompile.cli import main  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402

HOSTILE = "ok\x1b]0;PWNED\x07\x1b[2J\rfake line"  # retitles the terminal, clears it, overwrites a line
SHOWN = "ok\\x1b]0;PWNED\\x07\\x1b[2J\\rfake line"
# What a terminal acts on: C0 (a newline only between rows), DEL, C1.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")


@pytest.fixture
def hostile_db(tmp_path, capsys) -> str:
    """A store holding a run imported from someone's Parquet export, its tag hostile."""
    folder = tmp_path / "theirs"
    folder.mkdir()
    with contextlib.closing(duckdb.connect()) as con:
        con.execute("COPY (SELECT 'r1' AS run_id, 'sdpa' AS variant, 8 AS seq_len, 'ok' AS status, "
                    f"1.0 AS latency_ms, ? AS tag) TO '{folder / 'measurements.parquet'}' (FORMAT parquet)", [HOSTILE])
    db = str(tmp_path / "runs.duckdb")
    assert main(["runs", "import", str(folder), "--db", db]) == 0
    capsys.readouterr()
    return db


@pytest.mark.parametrize("fmt", ["table", "csv"])
def test_query_escapes_control_characters_of_stored_text(hostile_db, capsys, fmt):
    assert main(["query", "SELECT run_id, tag FROM runs", "--format", fmt, "--db", hostile_db]) == 0
    out = capsys.readouterr().out
    assert SHOWN in out and not CONTROL.search(out), repr(out)  # was printed raw


def test_query_json_keeps_stored_text_exact(hostile_db, capsys):
    assert main(["query", "SELECT tag FROM runs", "--format", "json", "--db", hostile_db]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == {"tag": HOSTILE} and not CONTROL.search(out)


def test_an_error_quoting_stored_text_is_escaped(hostile_db, capsys):
    assert main(["query", "SELECT tag::INTEGER FROM runs", "--db", hostile_db]) == 1  # DuckDB quotes the value
    err = capsys.readouterr().err.strip()
    assert err.startswith("dilcompile query: error: Conversion Error") and "ok\\x1b]0;PWNED\\x07" in err
    assert not CONTROL.search(err) and len(err.splitlines()) == 1


def test_result_tables_of_every_command_escape_control_characters():
    names, rows = ["why\x1b[2J"], [("a\x7fb\x9bc\td\ne",), (None,)]  # DEL; C1 CSI; tab and newline
    for fmt in ("table", "csv"):  # profile's and maxlen's tables are render's too
        out = render(names, rows, fmt)
        assert "why\\x1b[2J" in out and "a\\x7fb\\x9bc\\td\\ne" in out and not CONTROL.search(out), (fmt, out)


@pytest.mark.parametrize("sql", [
    "SELECT content FROM read_text('{secret}')",
    "SELECT * FROM read_csv('{secret}')",
    "SELECT * FROM glob('{folder}/*')",
    "COPY (SELECT * FROM runs) TO '{folder}/leak.csv'",
    "EXPORT DATABASE '{folder}/leak'",
    "ATTACH '{folder}/other.duckdb' AS other",
    "SET enable_external_access = true",
    "LOAD httpfs",
])
def test_query_reaches_the_store_alone_by_default(hostile_db, tmp_path, capsys, sql):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret\n")
    duckdb.connect(str(tmp_path / "other.duckdb")).close()
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["query", sql.format(secret=secret, folder=tmp_path), "--db", hostile_db]) == 1  # all ran: exit 0
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "s3cret" not in captured.out + err and "secret.txt" not in captured.out
    assert err.startswith("dilcompile query: error: ") and "pass --allow-files" in err and len(err.splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_allow_files_lets_the_query_use_files(hostile_db, tmp_path, capsys):
    secret = tmp_path / "mine.txt"
    secret.write_text("mine")
    assert main(["query", f"SELECT content FROM read_text('{secret}')", "--allow-files", "--db", hostile_db]) == 0
    assert "mine" in capsys.readouterr().out
    out = tmp_path / "runs.csv"
    assert main(["query", f"COPY (SELECT run_id FROM runs) TO '{out}'", "--allow-files", "--db", hostile_db]) == 0
    assert out.read_text().split() == ["run_id", "r1"]
    assert main(["query", "INSERT INTO sweeps (sweep_id) VALUES ('x')", "--allow-files", "--db", hostile_db]) == 1
    assert "read-only" in capsys.readouterr().err  # the store itself stays read-only


def test_query_help_says_what_the_default_allows(capsys):
    with pytest.raises(SystemExit) as done:
        main(["query", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "By default the statement reads the store and nothing else" in text
    assert "read_text, glob, COPY" in text and "--allow-files lifts all but the first" in text
    assert "--allow-files let the statement reach beyond the store" in text
