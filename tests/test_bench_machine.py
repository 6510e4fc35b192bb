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
    monkeypatch.setattr(bench_main, "git_commit", lambda folder: "abc123-dirty")
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
