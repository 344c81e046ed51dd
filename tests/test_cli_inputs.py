"""Hostile or mistyped CLI input: one line on stderr, exit 2, nothing measured
and no store written (the CLI's usage-error contract)."""

from __future__ import annotations

import os

import pytest

from dilcompile.cli import main

SMALL = ["--heads", "1", "--head-dim", "8", "--no-progress"]


def _usage_error(capsys, argv) -> str:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = capsys.readouterr().err.strip()
    assert rc == 2, (argv, rc, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def _sweep(tmp_path, body: str) -> str:
    path = tmp_path / "sweep.toml"
    path.write_text('name = "t"\n' + body)
    return str(path)


@pytest.mark.parametrize("db", ["", " ", ":memory:"])
def test_a_db_that_is_not_a_file_is_refused(tmp_path, capsys, db):
    err = _usage_error(capsys, ["profile", "--variant", "sdpa", "--seq-len", "16", *SMALL, "--db", db])
    assert "--db" in err and "not a file" in err


def test_a_folder_as_db_is_refused(tmp_path, capsys):
    err = _usage_error(capsys, ["query", "SELECT 1", "--db", str(tmp_path)])
    assert "is a folder" in err


def test_profile_inputs_are_usage_errors(tmp_path, capsys):
    db = str(tmp_path / "runs.duckdb")
    cases = {
        "device must be cpu": ["--variant", "sdpa", "--seq-len", "16", "--device", "banana"],
        "one CPU device": ["--variant", "sdpa", "--seq-len", "16", "--device", "cpu:5"],
        "seq_len must be an int in 1..": ["--variant", "sdpa", "--seq-len", "99999999999999999999"],
        "heads must be an int in 1..": ["--variant", "sdpa", "--seq-len", "16", "--heads", str(2**31)],
        "unknown pattern 'bogus'": ["--variant", "block-sparse:bogus(1)", "--seq-len", "16"],
        "window must be": ["--variant", "block-sparse:local_window(-1)", "--seq-len", "16"],
        "max_time_s < inf": ["--variant", "sdpa", "--seq-len", "16", "--max-time", "nan"],
        "cannot read sweep file": ["--sweep", str(tmp_path)],
    }
    for expected, argv in cases.items():
        argv = [*argv, *SMALL] if "--heads" not in argv else [*argv, "--no-progress"]
        assert expected in _usage_error(capsys, ["profile", *argv, "--db", db])
    assert not os.path.exists(db)


@pytest.mark.parametrize("body, expected", [
    ('[[grid]]\nvariant = "sdpa"\nseq_len = 16\ndevice = "cuda:7"\n', "cuda:7"),
    ('[[grid]]\nvariant = "sdpa"\nseq_len = 16\ndevice = "cpu:5"\n', "one CPU device"),
    ('[[grid]]\nvariant = [1]\nseq_len = 16\n', "variant must be a name"),
    ('max_time_s = nan\n[[grid]]\nvariant = "sdpa"\nseq_len = 16\n', "max_time_s"),
    ('max_time_s = inf\n[[grid]]\nvariant = "sdpa"\nseq_len = 16\n', "max_time_s"),
    ('grid = [1]\n', "table of keys"),
    ('[[grid]]\nvariant = "sdpa"\nseq_len = 99999999999999999\nheads = 3000000000\n', "heads"),
    ('[[grid]]\nvariant = "dilated"\nseq_len = 64\nsegments = 32\nrates = 1\n', "segments must be a list"),
    ('[[grid]]\nvariant = "dilated"\nseq_len = 64\nsegments = [32.5]\nrates = [1]\n', "segments must be a list"),
    ('warmup = 1.7\n[[grid]]\nvariant = "sdpa"\nseq_len = 16\n', "warmup must be an int"),  # ran 1
    ('repeats = 2.9\n[[grid]]\nvariant = "sdpa"\nseq_len = 16\n', "repeats must be an int"),
    ('max_time_s = "x"\n[[grid]]\nvariant = "sdpa"\nseq_len = 16\n', "max_time_s must be a number"),
    ('[[grid]]\nvariant = "block-sparse:local_window(window=256,window=3)"\nseq_len = 16\n', "given twice"),
])
def test_sweep_file_values_are_usage_errors(tmp_path, capsys, body, expected):
    import torch

    if "cuda:7" in body and torch.cuda.device_count() > 7:
        body = body.replace("cuda:7", f"cuda:{torch.cuda.device_count()}")
        expected = f"cuda:{torch.cuda.device_count()}"
    db = str(tmp_path / "runs.duckdb")
    err = _usage_error(capsys, ["profile", "--sweep", _sweep(tmp_path, body), "--no-progress", "--db", db])
    assert expected in err
    assert not os.path.exists(db)


@pytest.mark.parametrize("sql, says", [("", "SQL is empty"), ("   ", "SQL is empty"), ("-- just a comment", "SQL is empty"),
                                       ("/* nothing */", "SQL is empty"), ("SELEC 1", "syntax error")])
def test_query_without_a_statement_is_a_usage_error(tmp_path, capsys, sql, says):
    from dilcompile import store

    db = str(tmp_path / "runs.duckdb")
    store.connect(db).close()
    assert says in _usage_error(capsys, ["query", sql, "--db", db])


def test_query_with_two_statements_is_a_usage_error(tmp_path, capsys):
    from dilcompile import store

    db = str(tmp_path / "runs.duckdb")
    store.connect(db).close()
    assert "2 statements" in _usage_error(capsys, ["query", "SELECT 1; SELECT 2", "--db", db])  # printed only the last


def test_query_reading_a_missing_file_does_not_call_the_store_damaged(tmp_path, capsys):
    from dilcompile.cli import main
    from dilcompile import store

    db = str(tmp_path / "runs.duckdb")
    store.connect(db).close()
    assert main(["query", f"SELECT * FROM read_parquet('{tmp_path}/nope.parquet')", "--allow-files", "--db", db]) == 1
    err = capsys.readouterr().err
    assert "nope.parquet" in err and "IO Error" in err and "damaged" not in err and "mv " not in err


@pytest.mark.parametrize("flag, value", [("--timeout", "0"), ("--timeout", "-5"), ("--timeout", "nan"),
                                         ("--repeats", "0")])
def test_maxlen_probe_settings_are_usage_errors(tmp_path, capsys, flag, value):
    db = str(tmp_path / "runs.duckdb")  # --timeout 0 stored every probe as a timeout, nan was a traceback
    err = _usage_error(capsys, ["maxlen", "--variant", "sdpa", "--start", "64", "--limit", "128", flag, value,
                                "--db", db])
    assert flag.lstrip("-") in err
    assert not os.path.exists(db)


@pytest.mark.parametrize("address", ["256.1.1.1", "no-such-host.invalid"])
def test_dashboard_with_an_address_that_is_not_this_machines(capsys, address):
    err = _usage_error(capsys, ["dashboard", "--address", address, "--port", "8599"])
    assert f"--address {address!r}" in err and "in use" not in err


def test_dashboard_asks_streamlit_to_check_the_host():
    from dilcompile.cli.dashboard import allowed_hosts, streamlit_command

    assert allowed_hosts("127.0.0.1") == ["localhost", "127.0.0.1", "::1"]
    assert allowed_hosts("10.1.2.3", ["Dash.Example"]) == ["localhost", "127.0.0.1", "::1", "10.1.2.3", "dash.example"]
    import socket

    assert socket.gethostname().lower() in allowed_hosts("0.0.0.0")
    cmd = streamlit_command(__file__, "127.0.0.1", 8599)
    pairs = dict(zip(cmd[::1], cmd[1:]))
    assert [cmd[i + 1] for i, a in enumerate(cmd) if a == "--server.allowedHosts"] == ["localhost", "127.0.0.1", "::1"]
    assert pairs["--server.enableCORS"] == "true" and pairs["--server.enableXsrfProtection"] == "true"
    assert pairs["--server.enableAgentApi"] == "false"
