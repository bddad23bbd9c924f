"""Reading traces: tandem's CSV (round trip, each kind of bad row), Philly's job log and
Alibaba's pod list (a few rows written by hand), and the modelled sample trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tandem.place.sim.trace import (
    ALIBABA_COLUMNS,
    ALIBABA_GPU_MEM,
    COLUMNS,
    KINDS,
    GiB,
    MiB,
    kind_of,
    read_alibaba,
    read_philly,
    read_trace,
    sample_trace,
    trace_job,
    write_trace,
)

SAMPLE = Path(__file__).resolve().parents[2] / "benchmarks" / "traces" / "sample-60.csv"
HEADER = ",".join(COLUMNS)


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- tandem's CSV ---------------------------------------------------------------------------------


def test_reads_sizes_auto_and_optional_columns(tmp_path):
    path = write(
        tmp_path,
        HEADER + ",priority,peak_gpu_mem\n"
        "0,a,python train.py --lr 0.1,2,8G,1,4G,300,0.3,light,,\n"
        "12.5,b,,4,1073741824,1,auto,600,0.55,medium,3,9G\n"
        "20,c,make data,1.5,512M,0,,60,1,cpu,,\n",
    )
    a, b, c = read_trace(path)
    assert a == trace_job(0.0, "a", "python train.py --lr 0.1", 2.0, 8 * GiB, 1, 4 * GiB, 300.0, 0.3, "light")
    assert (b.offset_s, b.spec.mem, b.spec.gpu_mem, b.spec.priority, b.peak_gpu_mem) == (
        12.5,
        GiB,
        None,
        3,
        9 * GiB,
    )
    assert b.true_gpu_mem == 9 * GiB  # auto: what it reaches
    assert a.true_gpu_mem == 4 * GiB  # declared and reached
    assert (c.gpus, c.spec.gpu_mem, c.spec.mem) == (0, None, 512 * MiB)


def test_optional_columns_may_be_absent(tmp_path):
    (job,) = read_trace(write(tmp_path, HEADER + "\n5,x,,1,1G,1,auto,10,0.5,heavy\n"))
    assert (job.spec.priority, job.peak_gpu_mem) == (0, None)
    assert job.true_gpu_mem == KINDS["heavy"].typical_gpu_mem()  # auto, no peak: its kind's typical size


def test_round_trip(tmp_path):
    jobs = [
        trace_job(0.0, "a", "python -c 'print(1)'", 2.0, 8 * GiB, 1, None, 300.0, 0.3, "light", 2, 3 * GiB),
        trace_job(123456.7, "b", "", 0.5, 12345, 2, 1234567, 0.25, 0.125, "", -1, None),
        trace_job(123457.0, "c", "", 1.0, 0, 0, None, 1.0, 1.0, "cpu"),
    ]
    path = tmp_path / "rt.csv"
    write_trace(jobs, path)
    assert read_trace(path) == jobs


@pytest.mark.parametrize(
    "row, where",
    [
        ("0,a,,1,lots,1,4G,10,0.3,light", "line 2, column 'mem': 'lots' is not a size"),
        ("0,a,,1,1G,1,4X,10,0.3,light", "line 2, column 'gpu_mem': '4X' is not a size"),
        ("-5,a,,1,1G,1,4G,10,0.3,light", "line 2, column 'offset_s': '-5' must be at least 0"),
        ("0,a,,1,1G,1,4G,0,0.3,light", "line 2, column 'duration_s': the run time must be above 0"),
        ("0,a,,1,1G,1,4G,10,1.5,light", "line 2, column 'compute': '1.5' must be between 0 and 1"),
        ("0,a,,1,1G,1.5,4G,10,0.3,light", "line 2, column 'gpus': '1.5' is not an integer"),
        ("0,a,,1,1G,1,,10,0.3,light", "line 2, column 'gpu_mem': empty"),
        ("0,a,,1,1G,1,4G,10,0.3,light,extra", "line 2: more fields than the header has columns"),
    ],
)
def test_bad_rows_name_line_and_column(tmp_path, row, where):
    path = write(tmp_path, HEADER + "\n" + row + "\n")
    with pytest.raises(ValueError) as err:
        read_trace(path)
    assert where in str(err.value)
    assert str(path) in str(err.value)


def test_bad_row_after_good_ones_names_its_line(tmp_path):
    path = write(
        tmp_path,
        HEADER + "\n0,a,,1,1G,1,4G,10,0.3,light\n1,b,,1,1G,1,4G,10,0.3,light\n2,c,,x,1G,1,4G,10,0.3,\n",
    )
    with pytest.raises(ValueError, match=r"line 4, column 'cpus': 'x' is not a number"):
        read_trace(path)


def test_missing_columns_are_named(tmp_path):
    path = write(tmp_path, "offset_s,name,command,cpus,mem,gpus,duration_s,kind\n0,a,,1,1G,1,10,light\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) gpu_mem, compute"):
        read_trace(path)


# --- Philly -------------------------------------------------------------------------------------


def attempt(start: str | None, end: str | None, *machines: int) -> dict:
    return {
        "start_time": start,
        "end_time": end,
        "detail": [{"ip": f"m{i}", "gpus": [f"gpu{g}" for g in range(n)]} for i, n in enumerate(machines)],
    }


PHILLY = [
    {  # submitted second; two attempts: the last one counts; 8 GPUs on one machine
        "status": "Pass",
        "vc": "ee9e8c",
        "jobid": "application_2",
        "attempts": [
            attempt("2017-10-07 01:12:09", "2017-10-07 01:13:23", 8),
            attempt("2017-10-07 01:13:30", "2017-10-07 02:13:30", 8),
        ],
        "submitted_time": "2017-10-07 01:11:39",
        "user": "ce2f4c",
    },
    {  # submitted first; 1 GPU, 10 minutes
        "status": "Killed",
        "vc": "ee9e8c",
        "jobid": "application_1",
        "attempts": [attempt("2017-10-07 01:05:00", "2017-10-07 01:15:00", 1)],
        "submitted_time": "2017-10-07 01:00:00",
        "user": "ab12cd",
    },
    {  # still running when the log was taken: skipped
        "status": "Running",
        "vc": "x",
        "jobid": "application_3",
        "attempts": [attempt("2017-10-07 03:00:00", "None", 1)],
        "submitted_time": "2017-10-07 02:59:00",
        "user": "u",
    },
    {
        "status": "Failed",
        "vc": "x",
        "jobid": "application_4",
        "attempts": [],
        "submitted_time": "2017-10-07 04:00:00",
    },
    {  # two machines, 2 + 4 GPUs
        "status": "Pass",
        "vc": "y",
        "jobid": "application_5",
        "attempts": [attempt("2017-10-07 05:00:00", "2017-10-07 05:00:30", 2, 4)],
        "submitted_time": "2017-10-07 04:59:00",
        "user": "v",
    },
]


def test_read_philly(tmp_path):
    path = write(tmp_path, json.dumps(PHILLY), "cluster_job_log")
    jobs = read_philly(path)
    assert [j.name for j in jobs] == ["application_1", "application_2", "application_5"]
    assert [j.offset_s for j in jobs] == [0.0, 699.0, 3 * 3600 + 59 * 60.0]
    assert [j.duration_s for j in jobs] == [600.0, 3600.0, 30.0]
    assert [j.gpus for j in jobs] == [1, 8, 6]
    for j in jobs:  # memory and compute come from the modelled mix
        kind = KINDS[j.kind]
        assert kind.compute[0] <= j.compute <= kind.compute[1]
        assert kind.gpu_mem_gib[0] * GiB <= j.spec.gpu_mem <= kind.gpu_mem_gib[1] * GiB
        assert j.spec.cpus == kind.reserves.cores * j.gpus
    assert read_philly(path) == jobs  # seeded
    assert [j.name for j in read_philly(path, limit=2)] == ["application_1", "application_2"]


def test_read_philly_refuses_other_json(tmp_path):
    with pytest.raises(ValueError, match="not a Philly cluster_job_log"):
        read_philly(write(tmp_path, '{"jobs": []}', "log.json"))


# --- Alibaba ------------------------------------------------------------------------------------

ALIBABA_HEADER = ",".join(ALIBABA_COLUMNS) + "\n"


def test_read_alibaba(tmp_path):
    path = write(
        tmp_path,
        ALIBABA_HEADER + "openb-pod-0022,4000,15258,1,220,,BE,Running,9679175,9973826,9679175\n"
        "openb-pod-0061,11908,47104,1,1000,,BE,Pending,10001278,10001403,\n"  # never scheduled
        "openb-pod-0017,88000,327680,8,1000,,Burstable,Succeeded,9437497,10769854,9437497\n"
        "openb-pod-0048,8000,30517,0,0,,BE,Running,9992086,10013821,9992086\n"
        "openb-pod-0035,16000,32768,1,460,V100M16|V100M32,LS,Running,9967058,9968575,9967063\n",
        "openb_pod_list_default.csv",
    )
    jobs = read_alibaba(path)
    assert [j.name for j in jobs] == ["openb-pod-0017", "openb-pod-0022", "openb-pod-0035", "openb-pod-0048"]
    big, share, spec, cpu = jobs
    assert big.offset_s == 0.0 and share.offset_s == 9679175 - 9437497
    assert (big.spec.cpus, big.spec.mem, big.gpus, big.compute) == (88.0, 327680 * MiB, 8, 1.0)
    assert big.duration_s == 10769854 - 9437497
    assert big.spec.gpu_mem == ALIBABA_GPU_MEM and big.kind == "heavy"
    assert (share.compute, share.spec.gpu_mem, share.kind) == (0.22, int(0.22 * ALIBABA_GPU_MEM), "light")
    assert spec.duration_s == 9968575 - 9967063 and spec.compute == 0.46
    assert (cpu.gpus, cpu.spec.gpu_mem, cpu.compute, cpu.kind) == (0, None, 1.0, "cpu")
    assert [j.name for j in read_alibaba(path, limit=1)] == ["openb-pod-0017"]


def test_read_alibaba_bad_rows(tmp_path):
    bad = write(tmp_path, ALIBABA_HEADER + "p,4000,many,1,220,,BE,Running,1,2,1\n", "bad.csv")
    with pytest.raises(ValueError, match=r"line 2, column 'memory_mib': 'many' is not a number"):
        read_alibaba(bad)
    short = write(tmp_path, "name,cpu_milli\np,1\n", "short.csv")
    with pytest.raises(ValueError, match="missing column"):
        read_alibaba(short)


# --- the modelled sample --------------------------------------------------------------------------


def test_sample_trace_mix_and_ranges():
    jobs = sample_trace(60, seed=0)
    assert len(jobs) == 60
    for name, kind in KINDS.items():
        share = sum(j.kind == name for j in jobs) / len(jobs)
        assert abs(share - kind.share) <= 0.10, (name, share)
    for j in jobs:
        kind = KINDS[j.kind]
        assert kind.gpu_mem_gib[0] * GiB <= j.spec.gpu_mem <= kind.gpu_mem_gib[1] * GiB
        assert kind.compute[0] <= j.compute <= kind.compute[1]
        assert kind.duration_s[0] <= j.duration_s <= kind.duration_s[1]
        assert j.gpus == 1 and j.spec.command == []
    offsets = [j.offset_s for j in jobs]
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert 0.5 * 100 < offsets[-1] / 59 < 2 * 100  # exponential gaps of mean ~100 s
    assert sample_trace(60, seed=0) == jobs and sample_trace(60, seed=1) != jobs


def test_shipped_sample_is_sample_trace_60():
    assert read_trace(SAMPLE) == sample_trace(60, seed=0)


def test_kind_of():
    assert [kind_of(c) for c in (0.1, 0.3, 0.5, 0.79, 0.8, 1.0)] == [
        "light",
        "light",
        "medium",
        "medium",
        "heavy",
        "heavy",
    ]
