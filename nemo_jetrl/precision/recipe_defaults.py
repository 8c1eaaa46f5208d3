"""The FP8 recipe's defaults, in one place: `PrecisionRecipe`'s fields and the config sections that build it
(`policy.fp8_cfg`, `policy.generation.kv_cache_calibration`) read them. Imports neither torch nor pydantic."""

from __future__ import annotations

GRANULARITY = "blockwise"  # the registered scale layout (precision/recipes/)
BLOCK_SIZE = 128  # 1x128 activation / gradient groups, 128x128 weight blocks
NUM_FIRST_LAYERS_IN_BF16 = 0
NUM_LAST_LAYERS_IN_BF16 = 0
POW2_WEIGHT_SCALES = False
POW2_ACTIVATION_SCALES = False
WGRAD_X_BLOCKS = "1x128"
TRAIN_KV_FAKE_QUANT = False
USE_DEEP_GEMM = False
CACHE_DGRAD_WEIGHT = False
TRANSIENT_TRAIN_WEIGHTS = True  # checkpointed eager training: one layer's FP8 weights alive, not the cache
KV_PERCENTILE = 99.9  # of the per-micro-batch amax values
KV_MARGIN = 1.05  # scale = amax * margin / 448
