"""Resolve `policy.model_name` to a HF causal LM + tokenizer, from local files only (the hub is never touched).

`tiny-arith` is the packaged warm-start checkpoint `nemo_jetrl/models/assets/tiny-arith/`; any other value must be a
local HF directory of a supported architecture (Llama, Qwen2, Qwen3, Qwen3-MoE), checked from its config.json before
any weight is read. Weights must be safetensors (`model.safetensors` or a sharded `model.safetensors.index.json`).
A Qwen3-MoE model comes back with its sparse blocks as `models.moe.MoeBlock`s (same Parameters and names).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from nemo_jetrl.models.moe import convert_moe_blocks
from nemo_jetrl.models.tiny import ATTN_IMPLEMENTATION, TINY_ARITH_DIR, TINY_ARITH_NAME

SUPPORTED_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# the exact command that (re)creates the packaged checkpoint; recorded in its README.md as well
TINY_ARITH_SFT_COMMAND = "uv run examples/run_sft.py --seed 0"


def resolve_model_dir(model_name: str, *, tiny_arith_dir: Path = TINY_ARITH_DIR) -> Path:
    """`tiny-arith` -> `tiny_arith_dir` (the packaged checkpoint); otherwise a local directory (ValueError if not)."""
    if not isinstance(model_name, str) or not model_name:
        raise ValueError(f"policy.model_name must be a non-empty string, got {model_name!r}")
    if model_name == TINY_ARITH_NAME:
        if not (tiny_arith_dir / "config.json").is_file() or not (tiny_arith_dir / "model.safetensors").is_file():
            raise ValueError(
                f"the packaged `{TINY_ARITH_NAME}` checkpoint is missing from {tiny_arith_dir}; "
                f"create it (about 1-2 min on 2 CPU cores) with: {TINY_ARITH_SFT_COMMAND}"
            )
        return tiny_arith_dir
    path = Path(model_name).expanduser()
    if not path.is_dir():
        raise ValueError(
            f"policy.model_name={model_name!r} is neither {TINY_ARITH_NAME!r} nor an existing local directory "
            "(hub downloads are disabled: download the model first and pass its directory)"
        )
    return path


def check_model_dir(path: Path) -> dict:
    """Validate a local HF checkpoint dir (config, supported arch, safetensors weights, tokenizer); return config."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"model directory {path} has no config.json")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"model directory {path}: config.json is not valid JSON ({err})") from err
    model_type = config.get("model_type")
    architectures = config.get("architectures") or []
    supported = ", ".join(f"{k} ({v})" for k, v in SUPPORTED_MODEL_TYPES.items())
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model directory {path}: unsupported model_type {model_type!r}; supported: {supported}")
    if architectures and architectures != [SUPPORTED_MODEL_TYPES[model_type]]:
        raise ValueError(
            f"model directory {path}: unsupported architectures {architectures}; "
            f"model_type {model_type!r} must be {[SUPPORTED_MODEL_TYPES[model_type]]} (supported: {supported})"
        )
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ValueError(f"model directory {path} has no weights: expected one of {list(WEIGHT_FILES)}")
    if not any((path / f).is_file() for f in TOKENIZER_FILES):
        raise ValueError(f"model directory {path} has no tokenizer: expected one of {list(TOKENIZER_FILES)}")
    return config


def is_moe_checkpoint(model_name: str) -> bool:
    """Whether `policy.model_name` names a local Qwen3-MoE checkpoint (from its config.json; False for anything that
    is not a readable local directory: the loader reports those)."""
    try:
        config = json.loads((resolve_model_dir(model_name) / "config.json").read_text())
    except (ValueError, OSError):
        return False
    return config.get("model_type") == "qwen3_moe"


def check_fp8_blockable(path: Path, config: dict, block: int, first_fp8_layer: int = 0) -> None:
    """ValueError naming the first decoder linear whose dims are not multiples of `block`, from config.json alone.

    Llama / Qwen2 / Qwen3 decoder layers all have the same shapes, so layer `first_fp8_layer` stands for every
    FP8-mapped one (Qwen3-MoE: its experts, and its dense MLP where it has dense layers); the full check
    (`build_layer_map`) runs again on the built model.
    """
    hidden, inter = config.get("hidden_size"), config.get("intermediate_size")
    heads = config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    if not all(isinstance(v, int) for v in (hidden, inter, heads)):
        return  # an unusual config: leave it to the layer map
    head_dim = config.get("head_dim") or hidden // heads
    prefix = f"model.layers.{first_fp8_layer}"
    shapes = {  # name: (out_features, in_features)
        "self_attn.q_proj": (heads * head_dim, hidden),
        "self_attn.k_proj": (kv_heads * head_dim, hidden),
        "self_attn.v_proj": (kv_heads * head_dim, hidden),
        "self_attn.o_proj": (hidden, heads * head_dim),
    }
    experts = config.get("num_experts") or config.get("num_local_experts")  # transformers >= 5 writes the latter
    moe_inter = config.get("moe_intermediate_size") if experts else None
    if isinstance(moe_inter, int):
        shapes.update(
            {"mlp.experts.gate_up_proj": (2 * moe_inter, hidden), "mlp.experts.down_proj": (hidden, moe_inter)}
        )
    if moe_inter is None or config.get("mlp_only_layers") or config.get("decoder_sparse_step", 1) != 1:
        shapes.update(
            {"mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden), "mlp.down_proj": (hidden, inter)}
        )
    for name, (n, k) in shapes.items():
        if n % block or k % block:
            raise ValueError(
                f"model directory {path}: layer '{prefix}.{name}' ({n}x{k}) cannot be blocked by the FP8 recipe "
                f"(dims must be multiples of {block}); use policy.precision=bf16 and "
                "policy.generation.precision=bf16 for this model"
            )


def load_model_and_tokenizer(
    model_name: str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    fp8_block: int | None = None,
    first_fp8_layer: int = 0,
    config_overrides: dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load `policy.model_name` as (causal LM in `dtype` on `device`, tokenizer) from local files only.

    The tokenizer pads on the left (the rollout layout); one without a pad token gets its eos token as pad.
    `fp8_block`: check from config.json, before any weight is read, that the FP8 linears can be blocked.
    `config_overrides` (`policy.hf_config_overrides`): config.json values replaced at load, as NeMo-RL does.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"load_model_and_tokenizer: dtype must be a floating torch.dtype, got {dtype!r}")
    path = resolve_model_dir(model_name)
    config = check_model_dir(path)
    config.update(config_overrides or {})
    if fp8_block is not None:
        check_fp8_blockable(path, config, fp8_block, first_fp8_layer)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError(f"tokenizer in {path} has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    if len(tokenizer) > config.get("vocab_size", len(tokenizer)):
        raise ValueError(
            f"model directory {path}: tokenizer has {len(tokenizer)} tokens but config.vocab_size is {config['vocab_size']}"
        )
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, local_files_only=True, attn_implementation=ATTN_IMPLEMENTATION, **(config_overrides or {})
    )
    convert_moe_blocks(model)
    return model.to(device), tokenizer
