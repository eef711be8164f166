"""What every results row records: its commit (``-dirty`` only for changed code), one JSON line per row."""

import subprocess

from benchmarks.records import git_commit


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

    from benchmarks.records import append_jsonl

    path = tmp_path / "r.jsonl"
    append_jsonl(path, [{"a": 1}, {"a": 2}])
    with pytest.raises(TypeError, match="one dict"):
        append_jsonl(path, {"a": 3, "b": 4})  # would have written "a" and "b" as two lines
    assert [json.loads(line) for line in path.read_text().splitlines()] == [{"a": 1}, {"a": 2}]
