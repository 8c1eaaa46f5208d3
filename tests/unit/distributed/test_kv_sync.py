"""Replaying per-chunk Q/K/V amax records reproduces the single-process QKVCalibrator bit for bit."""

from __future__ import annotations

import pytest
import torch

from nemo_jetrl.policy.parallel.kv_sync import gather_qkv_records, scales_from_records
from nemo_jetrl.precision.kv import QKVCalibrator
from nemo_jetrl.precision.recipe import KVCalibration

LAYERS = 3


def _forwards(n: int) -> list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]]:
    gen = torch.Generator().manual_seed(0)
    return [
        [tuple(torch.randn(2, 2, 5, 8, generator=gen) * (1 + f + layer) for _ in range(3)) for layer in range(LAYERS)]
        for f in range(n)
    ]


@pytest.mark.parametrize("num_forwards", [1, 5])
def test_records_from_chunks_give_the_single_process_scales(num_forwards):
    calib = KVCalibration(percentile=90.0, margin=1.05)
    forwards = _forwards(num_forwards)
    single = QKVCalibrator(LAYERS, calib)  # one calibrator over every forward, as NativePolicy.get_logprobs
    records = []  # one calibrator per forward, as a rank's chunks
    for fwd in forwards:
        per_chunk = QKVCalibrator(LAYERS, calib)
        for layer, (q, k, v) in enumerate(fwd):
            single.observe(layer, q, k, v)
            per_chunk.observe(layer, q, k, v)
        records.append(per_chunk.amax())
    # two "ranks": the first holds the first chunks; gathering keeps chunk order
    gathered = gather_qkv_records(records[:2]) + gather_qkv_records(records[2:])
    got, want = scales_from_records(gathered, LAYERS, calib, "cpu"), single.scales()
    for name in ("q", "k", "v"):
        assert torch.equal(getattr(got, name), getattr(want, name))


def test_no_records_is_an_error():
    with pytest.raises(ValueError, match="no Q/K/V records"):
        scales_from_records([], LAYERS, KVCalibration(), "cpu")
    with pytest.raises(ValueError, match=r"record shape \(2, 3\)"):
        scales_from_records([torch.ones(2, 3)], LAYERS, KVCalibration(), "cpu")
