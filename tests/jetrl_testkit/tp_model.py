"""`tiny-arith` with its one KV head duplicated (2 query heads, 2 KV heads): the same function, bit for bit in FP32,
and a model tensor parallel can split at T = 2 (the packaged model's single KV head cannot be split)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from nemo_jetrl.models.tiny import TINY_ARITH_DIR


def write_tiny_arith_kv2(dst: Path) -> Path:
    """Copy the packaged tiny-arith into `dst` with every k_proj / v_proj's rows [128, 256] repeated ([256, 256])."""
    shutil.copytree(TINY_ARITH_DIR, dst)
    config = json.loads((dst / "config.json").read_text())
    kv, heads = int(config["num_key_value_heads"]), int(config["num_attention_heads"])
    assert (kv, heads) == (1, 2), (kv, heads)
    config["num_key_value_heads"] = heads
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    weights = load_file(dst / "model.safetensors")
    for name in list(weights):
        if name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            weights[name] = weights[name].repeat(heads // kv, 1).contiguous()
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst
