"""HF export: BF16 / FP32 safetensors that transformers reloads with the same logits, and vLLM's blockwise FP8
layout whose bits and scales are exactly the trainer's quantized weights."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_jetrl.config import load_config
from nemo_jetrl.models.export import export_hf
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, convert_to_fp8, weight_dequant
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.checkpoint import CheckpointManager

REPO = Path(__file__).resolve().parents[3]
RECIPE = PrecisionRecipe.preset("jetrl", num_last_layers_in_bf16=1)  # layer 3 stays BF16


@pytest.fixture(scope="module")
def trained():
    """(policy model with Fp8Linear layers and 'trained' weights, the same weights as a plain HF model, tokenizer)."""
    model, tokenizer = load_model_and_tokenizer("tiny-arith")
    with torch.no_grad():  # move every weight off the packaged values, as training would
        gen = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 1e-3)
    plain = copy.deepcopy(model)
    convert_to_fp8(model, RECIPE)
    return model, plain, tokenizer


IDS = torch.tensor([[1, 5, 6, 14, 7, 8, 15], [1, 13, 4, 14, 9, 9, 15]])


def test_bf16_export_reloads_with_identical_logits(trained, tmp_path):
    model, plain, tokenizer = trained
    out = export_hf(model, tokenizer, tmp_path / "bf16")
    reloaded = AutoModelForCausalLM.from_pretrained(out).eval()
    assert reloaded.dtype == torch.bfloat16
    assert "lm_head.weight" not in load_file(out / "model.safetensors")  # tied: written once
    assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
    # the policy's weights rounded to bf16 in a model built the way from_pretrained builds one (fp32 RoPE buffers)
    reference, _ = load_model_and_tokenizer("tiny-arith", dtype=torch.bfloat16)
    reference.load_state_dict({k: v.to(torch.bfloat16) for k, v in plain.state_dict().items()})
    reference.eval()
    with torch.no_grad():
        assert torch.equal(reloaded(IDS).logits, reference(IDS).logits)
    assert AutoTokenizer.from_pretrained(out)("12+34=")["input_ids"] == tokenizer("12+34=")["input_ids"]
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and "quantization_config" not in config


def test_fp32_export_is_the_master_weights_exactly(trained, tmp_path):
    model, plain, tokenizer = trained
    out = export_hf(model, tokenizer, tmp_path / "fp32", dtype=torch.float32)
    reloaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    for name, tensor in plain.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    with torch.no_grad():
        assert torch.equal(reloaded(IDS).logits, plain.eval()(IDS).logits)


def test_fp8_export_is_the_trainers_quantized_weights_bitwise(trained, tmp_path):
    model, _, tokenizer = trained
    out = export_hf(model, tokenizer, tmp_path / "fp8", fp8=True, recipe=RECIPE)
    tensors = load_file(out / "model.safetensors")
    fp8_layers = {n: m for n, m in model.named_modules() if isinstance(m, Fp8Linear)}
    assert len(fp8_layers) == 21  # 7 linears x layers 0..2; layer 3 is BF16 by the layer map
    for name, module in fp8_layers.items():
        q = module.quantized_weight()
        data, scale = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale_inv"]
        assert data.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
        assert scale.shape == (module.out_features // 128, module.in_features // 128)
        assert torch.equal(data.view(torch.uint8), q.data.view(torch.uint8)), name
        assert torch.equal(scale, q.scale), name
        assert torch.equal(weight_dequant(data, scale, 128), weight_dequant(q.data, q.scale, 128)), name
    bf16_keys = [k for k in tensors if k.startswith("model.layers.3.") and k.endswith("proj.weight")]
    assert len(bf16_keys) == 7 and all(tensors[k].dtype == torch.bfloat16 for k in bf16_keys)
    assert not any(k.startswith("model.layers.3.") and "scale" in k for k in tensors)
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert {k: quant[k] for k in ("quant_method", "fmt", "activation_scheme", "weight_block_size")} == {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
        "weight_block_size": [128, 128],
    }
    assert "lm_head" in quant["modules_to_not_convert"]
    assert "model.layers.3.mlp.down_proj" in quant["modules_to_not_convert"]
    assert not any(n in quant["modules_to_not_convert"] for n in fp8_layers)


def test_fp8_export_of_a_bf16_policy_quantizes_the_same_way(trained, tmp_path):
    _, plain, tokenizer = trained
    out = export_hf(plain, tokenizer, tmp_path / "fp8_from_plain", fp8=True, recipe=PrecisionRecipe.preset("bf16"))
    converted, _, _ = trained
    tensors = load_file(out / "model.safetensors")
    q = converted.get_submodule("model.layers.3.mlp.up_proj")  # BF16 in RECIPE, FP8 in the all-layers export
    assert tensors["model.layers.3.mlp.up_proj.weight"].dtype == torch.float8_e4m3fn
    q0 = converted.get_submodule("model.layers.0.mlp.up_proj").quantized_weight()
    assert torch.equal(tensors["model.layers.0.mlp.up_proj.weight_scale_inv"], q0.scale)
    assert isinstance(q, torch.nn.Linear)


def test_refuses_a_non_empty_foreign_directory(trained, tmp_path):
    model, _, tokenizer = trained
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="is not empty and holds no earlier export"):
        export_hf(model, tokenizer, tmp_path)
    assert (tmp_path / "notes.txt").read_text() == "keep me"


def _export_cli():
    spec = importlib.util.spec_from_file_location("export_hf_cli", REPO / "examples" / "export_hf.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_exports_the_newest_valid_checkpoint(trained, tmp_path, capsys):
    model, plain, _ = trained
    cfg = validate_config(load_config(REPO / "examples" / "configs" / "grpo_tiny.yaml")).model_dump()
    manager = CheckpointManager(tmp_path / "ckpt")
    manager.save(4, {"policy": {"model": model.state_dict(), "optimizer": {}, "step": 4}, "step": 4, "config": cfg})
    cli = _export_cli()
    assert cli.main(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "out"), "--dtype", "float32"]) == 0
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32)
    assert torch.equal(reloaded.model.layers[2].mlp.up_proj.weight, plain.model.layers[2].mlp.up_proj.weight)
    assert "exported policy of" in capsys.readouterr().out

    assert cli.main(["--checkpoint", str(tmp_path / "empty"), "--out", str(tmp_path / "o2")]) == 2
    assert "error: no valid checkpoint (step_<N> with meta.json) under" in capsys.readouterr().err
    assert cli.main(["--checkpoint", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o3"), "a.b=1"]) == 2
    assert "need --config" in capsys.readouterr().err
