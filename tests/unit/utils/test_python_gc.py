"""`startup_objects_frozen`: start-up's objects out of the collector's scans for the block, new garbage collected."""

import gc
import weakref

from nemo_jetrl.utils.python_gc import startup_objects_frozen


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_startup_objects_are_frozen_for_the_block_and_later_garbage_is_still_collected():
    startup = Node()
    startup_ref = weakref.ref(startup)
    with startup_objects_frozen() as frozen:
        assert frozen > 1000 and gc.get_freeze_count() > 1000  # pytest, torch, ... and `startup`
        del startup
        gc.collect()
        assert startup_ref() is not None  # frozen: no collection scans it while the block runs
        step_garbage = Node()
        step_ref = weakref.ref(step_garbage)
        del step_garbage
        assert gc.collect() >= 1 and step_ref() is None  # what the steps make is collected as before
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert startup_ref() is None  # unfrozen: collected again
