"""`cuda_graph.collector_paused`: cyclic garbage is collected before a capture and the collector stays off during it."""

import gc
import weakref

import pytest

from nemo_jetrl.generation.native.cuda_graph import collector_paused


class Node:
    pass


def test_collects_dead_cycles_first_and_pauses_the_collector():
    node = Node()
    node.me = node  # a cycle: freed only by the cyclic collector
    alive = weakref.ref(node)
    del node
    assert gc.isenabled()
    with collector_paused():
        assert alive() is None
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restores_the_collector_after_an_exception_and_keeps_a_disabled_one_off():
    with pytest.raises(RuntimeError, match="capture failed"), collector_paused():
        raise RuntimeError("capture failed")
    assert gc.isenabled()
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
