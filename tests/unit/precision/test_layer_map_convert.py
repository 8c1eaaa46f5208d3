"""One layer map for both sides; convert_to_fp8 on tiny HF Qwen3 / Llama models; a few FP8 training steps."""

import copy

import pytest
import torch
import transformers
from torch import nn

from nemo_jetrl.precision import Fp8Linear, PrecisionRecipe, build_layer_map, convert_to_fp8, decoder_layer_index

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TINY = dict(
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=4,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=128,
    vocab_size=32,
    tie_word_embeddings=True,
)


def tiny_model(kind: str = "qwen3", seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**TINY))
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))


class FakeDecoder(nn.Module):
    """`layers.{i}.proj` linears only: exercises name matching without an HF model."""

    def __init__(self, num_layers: int, dims=(128, 128)):
        super().__init__()
        self.layers = nn.ModuleList(nn.ModuleDict({"proj": nn.Linear(*dims)}) for _ in range(num_layers))
        self.head = nn.Linear(128, 128)


def test_decoder_layer_index_uses_the_trailing_dot():
    assert decoder_layer_index("model.layers.2.mlp.up_proj") == 2
    assert decoder_layer_index("model.layers.20.mlp.up_proj") == 20
    assert decoder_layer_index("layers.0.proj") == 0
    assert decoder_layer_index("model.layers_extra.2.proj") is None
    assert decoder_layer_index("lm_head") is None


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_layer_map_honours_first_and_last_bf16_layers(kind):
    model = tiny_model(kind)
    recipe = PrecisionRecipe.preset("jetrl", num_first_layers_in_bf16=1, num_last_layers_in_bf16=1)
    layer_map = build_layer_map(model, recipe)
    expected = {
        f"model.layers.{i}.{sub}.{p}": ("fp8" if i in (1, 2) else "bf16")
        for i in range(4)
        for sub, ps in (("self_attn", PROJECTIONS[:4]), ("mlp", PROJECTIONS[4:]))
        for p in ps
    }
    expected["lm_head"] = "bf16"
    assert layer_map == expected
    assert list(build_layer_map(model, PrecisionRecipe.preset("jetrl")).values()).count("fp8") == 28


def test_trailing_dot_with_twelve_layers():
    model = FakeDecoder(12)
    layer_map = build_layer_map(model, PrecisionRecipe.preset("jetrl", num_first_layers_in_bf16=2))
    assert layer_map["layers.0.proj"] == layer_map["layers.1.proj"] == "bf16"
    assert layer_map["layers.10.proj"] == layer_map["layers.11.proj"] == "fp8"  # `layers.1.` is not `layers.1x.`
    assert layer_map["head"] == "bf16"
    layer_map = build_layer_map(model, PrecisionRecipe.preset("jetrl", num_last_layers_in_bf16=1))
    assert layer_map["layers.11.proj"] == "bf16" and layer_map["layers.1.proj"] == "fp8"


def test_bf16_recipe_gives_all_bf16_and_converts_nothing():
    model = tiny_model()
    for recipe in (PrecisionRecipe.preset("bf16"), PrecisionRecipe(train="bf16", rollout="bf16", kv_cache_dtype="fp8")):
        layer_map = convert_to_fp8(model, recipe)
        assert set(layer_map.values()) == {"bf16"} and len(layer_map) == 29
    assert not any(isinstance(m, Fp8Linear) for m in model.modules())


def test_refusals_name_the_problem():
    with pytest.raises(ValueError, match=r"layer 'layers.0.proj' \(128x100\).*not multiples of the block size 128"):
        build_layer_map(FakeDecoder(2, dims=(100, 128)), PrecisionRecipe.preset("jetrl"))
    build_layer_map(FakeDecoder(2, dims=(100, 128)), PrecisionRecipe.preset("bf16"))  # bf16: nothing to refuse
    recipe = PrecisionRecipe.preset("jetrl", num_first_layers_in_bf16=2, num_last_layers_in_bf16=2)
    with pytest.raises(ValueError, match="converts no layer"):
        build_layer_map(tiny_model(), recipe)
    with pytest.raises(ValueError, match="converts no layer"):
        build_layer_map(nn.Sequential(nn.Linear(128, 128)), PrecisionRecipe.preset("jetrl"))


@pytest.mark.parametrize("preset", ["jetrl", "fp8_rollout_only"])
def test_convert_swaps_in_place_without_copying(preset):
    model = tiny_model()
    recipe = PrecisionRecipe.preset(preset, num_last_layers_in_bf16=1)
    params_before = {name: p for name, p in model.named_parameters()}
    keys_before = list(model.state_dict())
    layer_map = convert_to_fp8(model, recipe)
    assert layer_map == build_layer_map(model, recipe)  # the map is stable across conversion
    for name, kind in layer_map.items():
        module = model.get_submodule(name)
        assert isinstance(module, Fp8Linear) == (kind == "fp8")
        if kind == "fp8":
            assert (module.train_fp8, module.rollout_fp8) == (recipe.train_fp8, recipe.rollout_fp8)
            assert module.weight is params_before[f"{name}.weight"]
    assert {name: p for name, p in model.named_parameters()} == params_before
    assert list(model.state_dict()) == keys_before
    assert isinstance(model.model.layers[3].mlp.up_proj, nn.Linear)


def test_convert_with_an_explicit_map_and_bad_maps():
    model = FakeDecoder(3)
    layer_map = {"layers.0.proj": "bf16", "layers.1.proj": "fp8", "layers.2.proj": "bf16", "head": "bf16"}
    assert convert_to_fp8(model, PrecisionRecipe.preset("jetrl"), layer_map) == layer_map
    assert [type(m).__name__ for m in (model.layers[0].proj, model.layers[1].proj)] == ["Linear", "Fp8Linear"]
    with pytest.raises(ValueError, match="must be 'fp8' or 'bf16'"):
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"), {"head": "fp16"})
    with pytest.raises(ValueError, match="does not have"):
        convert_to_fp8(model, PrecisionRecipe.preset("jetrl"), {"layers.9.proj": "fp8"})


def _train(model, steps=6, lr=1e-3):
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, 32, (4, 32), generator=gen)  # a fixed random next-token batch
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(input_ids=input_ids, labels=input_ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_fp8_training_on_tiny_qwen3_reduces_loss_and_tracks_fp32():
    torch.manual_seed(0)
    fp32_model = tiny_model()
    fp8_model = copy.deepcopy(fp32_model)
    layer_map = convert_to_fp8(fp8_model, PrecisionRecipe.preset("jetrl"))
    assert sum(isinstance(m, Fp8Linear) for m in fp8_model.modules()) == list(layer_map.values()).count("fp8") == 28
    fp8_losses, fp32_losses = _train(fp8_model), _train(fp32_model)
    assert fp8_losses[0] != fp32_losses[0]  # the FP8 path really ran
    assert fp8_losses[-1] < fp8_losses[0] - 1.5, fp8_losses  # measured 3.54 -> 1.36
    assert all(b < a for a, b in zip(fp8_losses, fp8_losses[1:])), fp8_losses
    assert max(abs(a - b) for a, b in zip(fp8_losses, fp32_losses)) < 0.05, (fp8_losses, fp32_losses)
