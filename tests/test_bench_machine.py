"""The machine entry of every bench run names the CPU, so runs on different machines can be told apart."""
from bench.__main__ import cpu_model

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
