"""RNG states as tensors and plain data, so a checkpoint loads with `torch.load(weights_only=True)`.

Python's `random.getstate()` is `(version, 625 ints, gauss_next)` and NumPy's legacy global state is
`(name, uint32[624] keys, pos, has_gauss, cached_gaussian)`: both are stored with their integer arrays as int64
tensors, never as pickled Python or NumPy objects.
"""

from __future__ import annotations

import random
import warnings
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """Python, NumPy (global), torch CPU and every CUDA device's RNG state, as tensors and plain values."""
    version, internal, gauss_next = random.getstate()
    name, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss": gauss_next},
        "numpy": {
            "name": str(name),
            "keys": torch.from_numpy(keys.astype(np.int64)),  # [624]
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached_gaussian),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Inverse of `capture_rng_state` (CUDA states only when saved and a GPU is present)."""
    py = state["python"]
    random.setstate((int(py["version"]), tuple(int(x) for x in py["internal"].tolist()), py["gauss"]))
    npy = state["numpy"]
    keys = npy["keys"].numpy().astype(np.uint32)
    np.random.set_state((npy["name"], keys, int(npy["pos"]), int(npy["has_gauss"]), float(npy["cached_gaussian"])))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) != torch.cuda.device_count():
            warnings.warn(
                f"checkpoint holds {len(cuda_states)} CUDA RNG states, this machine has {torch.cuda.device_count()} "
                "devices; restoring the common ones",
                stacklevel=2,
            )
        for device, device_state in enumerate(cuda_states[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, device)
