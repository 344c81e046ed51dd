"""The SQL page copes where the `dilcompile query` CLI does: every DuckDB
result type, repeated column names, integers past int64, time zones; the
user's text is bounded and parsed only in the limited child process."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

duckdb = pytest.importorskip("duckdb")
from dashboard import sqlrun  # noqa: E402

AppTest = pytest.importorskip("streamlit.testing.v1").AppTest
APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")

# (DuckDB expression, a name) — one of each result type the page must show.
TYPED = [
    ("1::TINYINT", "tinyint"), ("170141183460469231731687303715884105727::HUGEINT", "hugeint_max"),
    ("(-170141183460469231731687303715884105727)::HUGEINT - 1", "hugeint_min"),
    ("340282366920938463463374607431768211455::UHUGEINT", "uhugeint_max"), ("18446744073709551615::UBIGINT", "ubig"),
    ("3.14159::DECIMAL(18, 5)", "decimal"), ("1e308::DOUBLE", "double"), ("'nan'::DOUBLE", "nan"),
    ("INTERVAL 3 DAY + INTERVAL 5 MINUTE", "interval"), ("uuid()", "uuid"), ("'\\xAA\\x00'::BLOB", "blob"),
    ("[1, 2, NULL]", "list"), ("{'a': 1, 'b': [now()]}", "struct"), ("MAP {'k': 1.5}", "map"),
    ("'x'::ENUM_T", "enum"), ("TIME '12:34:56'", "time"), ("DATE '2026-11-24'", "date"),
    ("TIMESTAMP '2026-11-24 12:00:00'", "ts"), ("now()", "tstz"), ("'12:00:00+05:30'::TIMETZ", "timetz"),
    ("TIMESTAMP_NS '2026-11-24 12:00:00.123456789'", "ts_ns"), ("NULL", "null"), ("'text ✓'", "varchar"),
    ("[[1.5], []]::DOUBLE[][]", "nested"), ("true", "bool"), ("[1, 2]::INTEGER[2]", "array"),
]


@pytest.fixture
def snapshot(tmp_path):
    path = str(tmp_path / "s.duckdb")
    con = duckdb.connect(path)
    con.execute("CREATE TYPE ENUM_T AS ENUM ('x', 'y')")
    con.execute("CREATE TABLE a (sweep_id INTEGER, v VARCHAR); CREATE TABLE b (sweep_id INTEGER, v VARCHAR)")
    con.execute("INSERT INTO a VALUES (1, 'p'), (2, 'q'); INSERT INTO b VALUES (1, 'r')")
    con.close()
    return path


@pytest.mark.parametrize("seed", range(3))
def test_every_result_type_reaches_the_page(snapshot, seed):
    rng = random.Random(seed)
    chosen = rng.sample(TYPED, 12)
    sql = "SELECT " + ", ".join(f"{expr} AS {name}" for expr, name in chosen) + " FROM range(3)"
    result = sqlrun.run_query(snapshot, sql)
    assert result.columns == [name for _, name in chosen] and len(result.rows) == 3
    import pyarrow as pa

    frame = result.frame()
    pa.Table.from_pandas(frame)  # what st.dataframe needs: no column fails
    assert list(frame.columns) == result.columns


def test_the_reported_queries(snapshot):
    result = sqlrun.run_query(snapshot, "SELECT * FROM a JOIN b ON a.sweep_id = b.sweep_id")
    assert list(result.frame().columns) == ["sweep_id", "v", "sweep_id_2", "v_2"]
    big = sqlrun.run_query(snapshot, "SELECT 170141183460469231731687303715884105727::HUGEINT AS h").frame()
    assert big["h"][0] == "170141183460469231731687303715884105727"
    now = sqlrun.run_query(snapshot, "SELECT now() AS t").rows[0][0]
    assert now.utcoffset() is not None


def test_the_text_is_bounded_and_never_parsed_in_the_server(snapshot, monkeypatch):
    def parse_in_server(sql):
        raise AssertionError("the server parsed the query")

    monkeypatch.setattr(duckdb, "extract_statements", parse_in_server)
    huge = "SELECT 1 IN (" + ",".join(["1"] * 3_000_000) + ")"
    with pytest.raises(sqlrun.QueryRefused, match="characters long; the SQL page takes at most 100,000"):
        sqlrun.run_query(snapshot, huge)
    with pytest.raises(sqlrun.QueryRefused, match="refused: DROP statement"):
        sqlrun.run_query(snapshot, "DROP TABLE a")  # the refusal comes from the child
    with pytest.raises(sqlrun.QueryRefused, match="one statement at a time"):
        sqlrun.run_query(snapshot, "SELECT 1; SELECT 2")
    assert sqlrun.run_query(snapshot, "SELECT 41 + 1").rows == [(42,)]


@pytest.mark.parametrize("module, name", [("pytz", "os.system"), ("pytz.tzinfo", "os.system"), ("pytz", "_p"),
                                          ("zoneinfo", "ZoneInfo"), ("builtins", "getattr"), ("os", "system")])
def test_the_reply_unpickler_allows_exact_names_only(module, name):
    import io

    with pytest.raises(sqlrun.QueryRefused, match="cannot show"):
        sqlrun._Unpickler(io.BytesIO(b"")).find_class(module, name)


def test_the_page_shows_duplicate_columns_hugeints_and_time_zones(sweep_db, dashboard_env):
    dashboard_env(sweep_db)
    at = AppTest.from_file(APP, default_timeout=120)
    at.switch_page("views/sql.py")
    at.run()
    for sql in ("SELECT * FROM measurements m JOIN sweeps s ON m.sweep_id = s.sweep_id LIMIT 3",
                "SELECT 170141183460469231731687303715884105727::HUGEINT AS h", "SELECT now() AS t"):
        at.text_area(key="sql_text").set_value(sql)
        at.button[0].click().run()
        assert not at.exception, (sql, [e.value for e in at.exception])
        assert not at.error, (sql, at.error[0].value)
