"""What every results row records: its commit (``-dirty`` only for changed code), one JSON line per row."""

import subprocess

from benchmarks.bench.records import git_commit, machine


def git(*args, cwd):
    subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


def test_appended_results_leave_the_commit_clean_and_changed_code_does_not(tmp_path, monkeypatch):
    (tmp_path / "benchmarks/results").mkdir(parents=True)
    (tmp_path / "benchmarks/results/x.jsonl").write_text("{}\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q", cwd=tmp_path)
    git("add", ".", cwd=tmp_path)
    git("commit", "-qm", "init", cwd=tmp_path)
    monkeypatch.chdir(tmp_path)
    clean = git_commit()
    assert clean and not clean.endswith("-dirty")
    (tmp_path / "benchmarks/results/x.jsonl").write_text("{}\n{}\n")
    assert git_commit() == clean
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_commit() == clean + "-dirty"


def test_append_jsonl_writes_one_line_per_row_and_refuses_a_bare_dict(tmp_path):
    import json

    import pytest

    from benchmarks.bench.records import append_jsonl

    path = tmp_path / "r.jsonl"
    append_jsonl(path, [{"a": 1}, {"a": 2}])
    with pytest.raises(TypeError, match="one dict"):
        append_jsonl(path, {"a": 3, "b": 4})  # would have written "a" and "b" as two lines
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}, {"a": 2}]


def test_latest_run_takes_each_dataset_from_the_newest_run_that_covers_it(tmp_path):
    import json

    from benchmarks.bench.records import latest_run, runs_of

    def row(run_id, dataset, mode):
        return {"run_id": run_id, "dataset": dataset, "mode": mode}

    whole = [row("1", d, m) for d in ("gsm8k", "arc-challenge") for m in ("exact", "rksc")]
    arc_again = [row("2", "arc-challenge", m) for m in ("exact", "rksc", "rksc-lru")]
    held_apart = [{**row("3", "gsm8k", "exact"), "calibration_offset": 50}]  # choosing thresholds: never shown
    path = tmp_path / "bon-verify.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in whole + arc_again + held_apart))
    rows = latest_run(path)
    assert [(r["run_id"], r["dataset"], r["mode"]) for r in rows] == [
        ("1", "gsm8k", "exact"), ("1", "gsm8k", "rksc"),
        ("2", "arc-challenge", "exact"), ("2", "arc-challenge", "rksc"), ("2", "arc-challenge", "rksc-lru")]
    assert [[r["run_id"] for r in run][0] for run in runs_of(rows)] == ["1", "2"]
    # a newer whole run supersedes both
    path.write_text(path.read_text() + "".join(json.dumps({**r, "run_id": "3"}) + "\n" for r in whole))
    assert {r["run_id"] for r in latest_run(path)} == {"3"}


def test_machine_names_the_processor_model_where_cpuinfo_has_one(tmp_path):
    import os

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n")
    assert machine(info).endswith(f"AMD EPYC 9R14 96-Core Processor, {os.cpu_count()} cores, CPU")
    assert machine(tmp_path / "absent").endswith(f", {os.cpu_count()} cores, CPU")
    assert "model" not in machine(tmp_path / "absent")
    # the flags that pick a kernel path: one model name covers CPUs with and without AMX tiles
    xeon = "model name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu avx512f avx512_vnni{}\n"
    info.write_text(xeon.format(""))
    assert machine(info).endswith(f"Intel(R) Xeon(R) Processor (AVX-512 VNNI), {os.cpu_count()} cores, CPU")
    info.write_text(xeon.format(" amx_bf16 amx_tile amx_int8"))
    assert "Intel(R) Xeon(R) Processor (AVX-512 VNNI, AMX), " in machine(info)
