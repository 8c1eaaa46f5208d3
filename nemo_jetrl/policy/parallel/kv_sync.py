"""FP8 KV-cache scales across data-parallel ranks: the single-process calibration, reproduced exactly.

`NativePolicy` records one per-layer Q/K/V amax [L, 3] per logprob forward (chunk) and takes a percentile across
chunks. Ranks here run the very same chunks (data_split cuts them the single-process way), so gathering every
rank's records in chunk order and replaying them into one `QKVCalibrator` gives bit-identical scales, which then
travel with the refit to every rollout engine.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist

from nemo_jetrl.precision.kv import KVScales, QKVCalibrator
from nemo_jetrl.precision.recipe import KVCalibration


def gather_qkv_records(records: Sequence[torch.Tensor], group=None) -> list[torch.Tensor]:
    """Collective over `group` (default: every rank; under TP the data-parallel group): every rank's [L, 3] amax
    records (CPU), concatenated in rank order (= chunk order)."""
    local = [r.detach().float().cpu() for r in records]
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return local
    gathered: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, local, group=group)
    return [r for rank_records in gathered for r in rank_records]


def scales_from_records(
    records: Sequence[torch.Tensor], num_layers: int, calibration: KVCalibration, device: torch.device | str
) -> KVScales:
    """Replay [L, 3] records (in chunk order) into one `QKVCalibrator`: the scales of the calibrator that saw them."""
    if not records:
        raise ValueError("scales_from_records: no Q/K/V records (no calibrating forward ran on any rank)")
    calibrator = QKVCalibrator(num_layers, calibration)
    for record in records:
        if record.shape != (num_layers, 3):
            raise ValueError(f"scales_from_records: record shape {tuple(record.shape)} != ({num_layers}, 3)")
        calibrator.add_record(record.to(device))
    return calibrator.scales()
