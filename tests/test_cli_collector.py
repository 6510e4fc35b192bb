"""`loopline run` as the process's command makes its imports with the cyclic collector off and
sets them aside from it after; called from Python it leaves the caller's collector alone."""
import gc

from pipeline.cli import _kept_to_the_end


def test_imports_are_made_without_the_collector_and_set_aside_after():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with _kept_to_the_end(True):
            assert not gc.isenabled()
            made = [[] for _ in range(1000)]  # 1000 objects the collector tracks
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(made)
    finally:
        gc.unfreeze()


def test_a_caller_s_collector_is_left_as_it_is():
    frozen = gc.get_freeze_count()
    with _kept_to_the_end(False):
        assert gc.isenabled()
        made = [[] for _ in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() == frozen and len(made) == 1000
