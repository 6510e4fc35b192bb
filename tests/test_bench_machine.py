"""The machine entry of every bench run names the CPU, so runs on different machines can be told apart."""
from bench.__main__ import cpu_model
from bench.report import short_commit

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
flags\t\t: fpu sse2 avx avx2 avx512f avx512bw amx_tile
processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz
"""


def test_cpu_model_reads_the_name_and_the_vector_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpu_model(str(path)) == {"cpu_model": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
                                    "cpu_vector_flags": ["avx2", "avx512f", "amx_tile"]}


def test_cpu_model_without_cpuinfo_is_empty(tmp_path):
    assert cpu_model(str(tmp_path / "missing")) == {}


def test_every_run_records_its_commit_and_label(tmp_path, monkeypatch):
    """`python -m bench` stamps each run with the code it measured and BENCH_LABEL's words,
    whichever benchmark ran (the benchmark's own figures kept)."""
    import json
    import sys
    import types

    import bench.__main__ as bench_main

    fake = types.ModuleType("bench.fake")
    fake.run = lambda: {"figure": 1.5}
    monkeypatch.setitem(sys.modules, "bench.fake", fake)
    monkeypatch.setattr(bench_main, "LONG", [*bench_main.LONG, "fake"])
    monkeypatch.setattr(bench_main, "RESULTS", tmp_path)
    monkeypatch.setattr(bench_main, "write_report", lambda: "report")
    monkeypatch.setattr(bench_main, "machine", lambda: {"cpus": 2})
    monkeypatch.setattr(bench_main, "git_commit", lambda folder, ignore=(): "abc123-dirty")
    monkeypatch.setenv("BENCH_LABEL", "after the change")

    assert bench_main.main(["--only", "fake"]) == 0
    monkeypatch.delenv("BENCH_LABEL")
    assert bench_main.main(["--only", "fake"]) == 0

    runs = json.loads((tmp_path / "fake.json").read_text())["runs"]
    assert [(r["figure"], r["commit"], r["label"]) for r in runs] == [(1.5, "abc123-dirty", "after the change"),
                                                                       (1.5, "abc123-dirty", "")]
    assert runs[0]["machine"] == {"cpus": 2} and "date" in runs[0]


def test_pages_name_a_runs_commit_short_and_whether_the_tree_differed():
    assert short_commit("0123456789abcdef0123456789abcdef01234567-dirty") == "0123456-dirty"
    assert short_commit("0123456789abcdef0123456789abcdef01234567") == "0123456"
    assert short_commit("0569f6f") == "0569f6f"  # quality runs written before every run was stamped
    assert short_commit(None) == short_commit("") == "unknown"


def test_a_commit_is_dirty_for_changed_code_and_not_for_the_files_a_benchmark_rewrites(tmp_path):
    """Each bench run rewrites bench/results and bench/REPORT.md: a run after another in a loop
    measures the committed code, and says so; a changed source file still makes it '-dirty'."""
    import subprocess

    from tracking.system_info import git_commit

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "bench" / "results").mkdir(parents=True)
    for name in ("code.py", "bench/results/quality.json", "bench/REPORT.md"):
        (tmp_path / name).write_text("1")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "c")
    outputs = ("bench/results", "bench/REPORT.md")
    clean = git_commit(str(tmp_path), ignore=outputs)
    assert clean and not clean.endswith("-dirty")

    (tmp_path / "bench" / "results" / "quality.json").write_text("2")
    (tmp_path / "bench" / "REPORT.md").write_text("2")
    assert git_commit(str(tmp_path / "bench"), ignore=outputs) == clean  # from a subfolder too
    assert git_commit(str(tmp_path)) == clean + "-dirty"  # without `ignore` they count

    (tmp_path / "code.py").write_text("2")
    assert git_commit(str(tmp_path), ignore=outputs) == clean + "-dirty"
