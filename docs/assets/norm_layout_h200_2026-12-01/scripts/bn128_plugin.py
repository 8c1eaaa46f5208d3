"""pytest -p bn128_plugin: the exact attention's key block set to 128 (both sides) before any test runs."""

import os

from nemo_jetrl.models import batch_invariant_kernels as K

K.ATTN_BLOCK_N = int(os.environ.get("PROBE_BLOCK_N", "128"))
if os.environ.get("PROBE_TRAIN_CONFIG"):
    K.TRAIN_CONFIG = tuple(int(v) for v in os.environ["PROBE_TRAIN_CONFIG"].split(","))
print(f"bn128_plugin: ATTN_BLOCK_N={K.ATTN_BLOCK_N} TRAIN_CONFIG={K.TRAIN_CONFIG}")
