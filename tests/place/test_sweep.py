"""A sweep as one request: --grid and --params FILE.jsonl, placeholders, one group; wait
and cancel a whole group; cancel --all."""

from __future__ import annotations

import json
import re
import sys
import time

import pytest

from tandem.place.model import run_name
from tandem.place.sweep import MAX_LINE, SweepError, fill, grid_points, parse_grid, read_params
from tests.timing import scaled


def test_grids_expand_to_the_cross_product_in_order():
    axes = parse_grid(["lr=0.1,0.01", "seed=0..2", "opt=sgd,adam"])
    points = grid_points(axes)
    assert len(points) == 12
    assert points[0] == {"lr": "0.1", "seed": "0", "opt": "sgd"}
    assert points[-1] == {"lr": "0.01", "seed": "2", "opt": "adam"}
    for bad, said in [
        (["lr"], "expected KEY=V1,V2"),
        (["lr=1,,2"], "an empty value"),
        (["n=3..1"], "is empty"),
        (["a=1", "a=2"], "given twice"),
        (["1x=2"], "expected KEY"),
    ]:
        try:
            parse_grid(bad)
        except SweepError as exc:
            assert said in str(exc)
        else:
            raise AssertionError(f"{bad} was taken")


def test_params_files_say_which_line_is_wrong(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text('{"lr": 0.1}\n\n{"lr": 0.2, "seed": 3}\n')
    assert read_params(good) == [{"lr": "0.1"}, {"lr": "0.2", "seed": "3"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"lr": 0.1}\n[1, 2]\n')
    try:
        read_params(bad)
    except SweepError as exc:
        assert "line 2" in str(exc)
    else:
        raise AssertionError("a list was taken for a point")


def test_values_are_the_text_given_and_distinct_strings_are_distinct_points(tmp_path):
    (axis,) = parse_grid(["x=1.0, 1.0000000000000001,1e3,true,1e999,NaN"]).values()
    assert list(axis) == ["1.0", "1.0000000000000001", "1e3", "true", "1e999", "NaN"]
    assert grid_points(parse_grid(["seed=008..011"])) == [{"seed": s} for s in ("008", "009", "010", "011")]
    assert [p["n"] for p in grid_points(parse_grid(["n=-2..1"]))] == ["-2", "-1", "0", "1"]
    assert fill("--lr={x} {{x}}", {"x": "1e3"}, "arg") == "--lr=1e3 {x}"
    lines = tmp_path / "p.jsonl"
    lines.write_text(
        '{"lr": 1.50, "opt": "adam", "warm": true, "cut": null, "sizes": [64, 1e2], "big": 1e999}\n'
    )
    (point,) = read_params(lines)
    assert point == {
        "lr": "1.50",
        "opt": "adam",
        "warm": "true",
        "cut": "null",
        "sizes": "[64, 1e2]",
        "big": "1e999",
    }


def test_a_range_is_counted_before_anything_is_listed():
    started = time.monotonic()
    axes = parse_grid(["a=0..100000000", "b=1..999999999999999999"])
    with pytest.raises(SweepError, match=r"at most 100,000 in one request"):
        grid_points(axes)
    assert time.monotonic() - started < scaled(1.0), "the range was listed, not counted"
    for bad, said in [
        (["a=0..1e3"], "whole numbers"),
        (["a=0.1..0.5"], "whole numbers"),
        (["a=1..1234567890123456789"], "up to 18 digits"),
        (["a=1..3,7"], "stands alone"),
        (["a=1,2,1"], "'1' is given twice"),
        (["lr=[0.1,0.01]"], r"listed bare, comma-separated: lr=0.1,0.01"),
        (["lr=(0.1, 0.01)"], r"lr=0.1, 0.01"),
        (["lr=0.1;0.01"], r"by commas, not ';': lr=0.1,0.01"),
    ]:
        with pytest.raises(SweepError, match=said):
            parse_grid(bad)


def test_placeholders_take_no_format_and_name_a_parameter():
    point = {"a": "1", "b": "2"}
    for template in ("{a:d}", "{a:{b}}", "{a:>99999999}", "{a!r}"):
        with pytest.raises(SweepError, match="a placeholder takes no format"):
            fill(template, point, "--name")
    for template in ("{a.real}", "{}", "{0}", "{a[0]}"):
        with pytest.raises(SweepError, match="not a parameter's name"):
            fill(template, point, "--name")
    with pytest.raises(SweepError, match="write {{"):
        fill("}", point, "--name")


def test_params_files_refuse_what_is_no_point_with_the_line(tmp_path):
    path = tmp_path / "p.jsonl"
    cases = [
        (b'{"a": 1}\n{"a": "\xff\xfe"}\n', "line 2: not UTF-8 (byte 8)"),
        (b'{"a": 1}\n{"a": "' + b"x" * (MAX_LINE + 1) + b'"}\n', "line 2: over 1 MiB"),
        (b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "line 1: nested too deep"),
        (b'{"a": 1, "a": 2}\n', "line 1: the key 'a' is given twice"),
        (b'{"a": {"b": 1, "b": 2}}\n', "the key 'b' is given twice"),
        (b'{"a": 1}\n\n{"a": 1}\n', "line 3: the same point as line 1"),
        (b'{"a": 1}\n{"a": 1.0}\n{"a": 1}\n', "line 3: the same point as line 1"),
        (b'{"a": 1', "line 1: not JSON"),
        (b'{"1a": 1}', "line 1: expected an object of names"),
    ]
    for content, said in cases:
        path.write_bytes(content)
        with pytest.raises(SweepError, match=re.escape(said)):
            read_params(path)
    path.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n{"a": 2}')  # a BOM and Windows line ends
    assert read_params(path) == [{"a": "1"}, {"a": "2"}]
    path.write_bytes(b'{"a": 1}\n' * 3)
    with pytest.raises(SweepError, match="split the sweep"):
        read_params(path, max_bytes=10)


def test_a_grid_is_one_request_one_group_with_each_jobs_params(cli):
    out = cli(
        "submit",
        "--cpus",
        "0.5",
        "--grid",
        "lr=0.1,0.01",
        "--grid",
        "seed=1..2",
        "--name",
        "r{lr}-{seed}",
        "--env",
        "SEED={seed}",
        "--",
        sys.executable,
        "-c",
        "import os, sys; print(sys.argv[1], os.environ['SEED'])",
        "{lr}",
    ).stdout.splitlines()
    group = out[0].removeprefix("group ")
    assert out[1] == "submitted 4 job(s): 1-4"
    jobs = cli.json("ls")
    assert [j["name"] for j in jobs] == ["r0.1-1", "r0.1-2", "r0.01-1", "r0.01-2"]
    assert {j["group"] for j in jobs} == {group}
    assert cli.job(2)["params"] == {"lr": "0.1", "seed": "2"}
    assert cli("wait", f"group:{group}", timeout=120).returncode == 0
    assert cli("logs", "4").stdout.strip() == "0.01 2"


def test_a_params_file_and_clear_refusals(inproc, tmp_path):
    cli = inproc().cli  # the daemon a first submit starts, with its defaults, in this process
    points = tmp_path / "points.jsonl"
    points.write_text("\n".join(json.dumps({"lr": lr}) for lr in (0.1, 0.2, 0.3)))
    made = json.loads(
        cli(
            "submit",
            "--cpus",
            "0.5",
            "--group",
            "file",
            "--params",
            str(points),
            "--json",
            "--",
            sys.executable,
            "-c",
            "pass",
            "{lr}",
        ).stdout
    )
    assert made["group"] == "file" and len(made["ids"]) == 3
    for args, said in [
        (["--grid", "lr=0.1", "--", "echo", "{rate}"], "no parameter 'rate'"),
        (["--grid", "lr=", "--", "echo", "{lr}"], "an empty value"),
        (["--grid", "lr=1", "--params", str(points), "--", "echo"], "not both"),
    ]:
        run = cli("submit", *args, check=False)
        assert run.returncode == 2 and said in run.stderr, run.stderr
        assert "Traceback" not in run.stderr


@pytest.mark.parametrize(
    "grid,said",
    [
        ("x=1..", "the range 1.. has no end"),
        ("x=..5", "the range ..5 has no start"),
        ("x=a..z", "the range a..z counts whole numbers of up to 18 digits, not 'a' and 'z'"),
        ("x=1..b", "not 'b'"),
        ("x=1.5..3", "not '1.5'"),
    ],
)
def test_a_range_with_a_missing_or_non_integer_end_is_refused_not_one_job(cli, grid, said):
    run = cli("submit", "--grid", grid, "--", "echo", "{x}", check=False)
    (line,) = [line for line in run.stderr.splitlines() if line.startswith("Error:")]  # after the usage
    assert run.returncode == 2 and said in line and "e.g. x=1..10" in line, run.stderr
    assert "Traceback" not in run.stderr
    assert cli.rows() == [] and cli.daemon_pid() is None, "nothing submitted, no daemon started"
    # A value with '..' in it that is meant as none (a path) is still a value.
    assert parse_grid(["data=../train,../val"]) == {"data": ["../train", "../val"]}


def test_cancel_a_group_and_then_everything(inproc):
    h = inproc()
    cli = h.cli
    cli(
        "submit", "--cpus", "2", "--", sys.executable, "-c", "import time; time.sleep(600)"
    )  # holds the cores
    a = cli("submit", "--group", "a", "--grid", "i=1..30", "--", "echo", "{i}").stdout.splitlines()
    cli("submit", "--group", "b", "--grid", "i=1..3", "--", "echo", "{i}")
    assert a[1] == "submitted 30 job(s): 2-31"
    out = cli("cancel", "group:a").stdout
    assert "cancelled 30 jobs" in out
    states = {j["id"]: j["state"] for j in h.json("ls", "--all")}
    assert all(states[i] == "cancelled" for i in range(2, 32))
    assert all(states[i] == "queued" for i in range(32, 35))
    cli("cancel", "--all")
    assert all(j["state"] == "cancelled" for j in h.json("ls", "--all"))
    run = cli("cancel", check=False)
    assert run.returncode == 2 and "--all" in run.stderr


def test_an_unnamed_jobs_run_is_called_by_its_script_and_its_sweep_point() -> None:
    assert run_name(None, ["python", "train.py", "0.1"], {"lr": "0.1"}) == "train.py lr=0.1"
    module = ["/usr/bin/python3", "-m", "pkg.train"]
    assert run_name(None, module, {"lr": 0.1, "wd": 0}) == "pkg.train lr=0.1 wd=0"
    assert run_name(None, ["python", "-c", "print()"], {}) == "python"
    assert run_name(None, ["sh", "-c", "true"], None) == "sh"
    assert run_name("mine", ["python", "train.py"], {"lr": 1}) == "mine"  # its --name, as given
