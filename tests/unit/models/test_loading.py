"""load_model_and_tokenizer: the packaged tiny-arith warm start, local HF dirs, and clear errors."""

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3ForCausalLM

from nemo_jetrl.environments import ArithmeticTask
from nemo_jetrl.models.loading import TINY_ARITH_SFT_COMMAND, load_model_and_tokenizer, resolve_model_dir
from nemo_jetrl.models.tiny import TINY_ARITH_DIR
from nemo_jetrl.models.tokenizer import build_arith_tokenizer

# greedy accuracy of the shipped checkpoint on the first 128 held-out prompts: measured 0.281 (0.299 on all 512,
# sft_meta.json); the band allows BLAS-order differences but fails on an untrained or over-trained checkpoint
GREEDY_ACC_RANGE = (0.20, 0.40)


@pytest.fixture(scope="module")
def tiny():
    return load_model_and_tokenizer("tiny-arith")


def test_packaged_checkpoint_is_package_data():
    assert TINY_ARITH_DIR.parts[-3:] == ("models", "assets", "tiny-arith")
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "sft_meta.json"):
        assert (TINY_ARITH_DIR / name).is_file(), name


def test_tiny_arith_loads_as_fp32_qwen3_with_arith_tokenizer(tiny):
    model, tok = tiny
    assert isinstance(model, Qwen3ForCausalLM) and not model.training
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ref = build_arith_tokenizer()
    assert tok("07+35=").input_ids == ref("07+35=").input_ids == [1, 4, 11, 14, 7, 9, 15]
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 2, "left")


@torch.no_grad()
def test_tiny_arith_greedy_held_out_accuracy_in_measured_range(tiny):
    model, tok = tiny
    problems = ArithmeticTask().validation(128)
    enc = tok([p.prompt for p in problems], return_tensors="pt", padding=True)  # [128, 7]
    out = model.generate(**enc, do_sample=False, max_new_tokens=4, pad_token_id=0, eos_token_id=2)  # [128, 7 + T]
    texts = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    acc = ArithmeticTask().score(texts, [p.answer for p in problems]).mean().item()
    assert GREEDY_ACC_RANGE[0] <= acc <= GREEDY_ACC_RANGE[1], acc


def test_bf16_load():
    model, _ = load_model_and_tokenizer("tiny-arith", dtype=torch.bfloat16)
    assert model.model.layers[0].mlp.up_proj.weight.dtype == torch.bfloat16


def _save_tiny_llama(path):
    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    build_arith_tokenizer().save_pretrained(path)


def test_local_llama_directory_loads(tmp_path):
    _save_tiny_llama(tmp_path)
    model, tok = load_model_and_tokenizer(str(tmp_path))
    assert isinstance(model, LlamaForCausalLM) and len(tok) == 32


def test_missing_directory(tmp_path):
    with pytest.raises(ValueError, match=r"neither 'tiny-arith' nor an existing local directory"):
        load_model_and_tokenizer(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="non-empty string"):
        load_model_and_tokenizer("")


def test_missing_packaged_checkpoint_gives_the_command(tmp_path):
    with pytest.raises(ValueError, match="run_sft.py") as err:
        resolve_model_dir("tiny-arith", tiny_arith_dir=tmp_path)
    assert TINY_ARITH_SFT_COMMAND in str(err.value)


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "unsupported model_type 'gpt2'"),
        ({"model_type": "qwen3", "architectures": ["Qwen3ForSequenceClassification"]}, "unsupported architectures"),
        ({"architectures": ["LlamaForCausalLM"]}, "unsupported model_type None"),
    ],
)
def test_unsupported_architecture(tmp_path, config, match):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=match):
        load_model_and_tokenizer(str(tmp_path))


def test_missing_files_and_bad_json(tmp_path):
    _save_tiny_llama(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="has no weights"):
        load_model_and_tokenizer(str(tmp_path))
    _save_tiny_llama(tmp_path)
    (tmp_path / "tokenizer.json").unlink()
    (tmp_path / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match="has no tokenizer"):
        load_model_and_tokenizer(str(tmp_path))
    (tmp_path / "config.json").unlink()
    with pytest.raises(ValueError, match="has no config.json"):
        load_model_and_tokenizer(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_model_and_tokenizer(str(tmp_path))
    with pytest.raises(ValueError, match="dtype"):
        load_model_and_tokenizer("tiny-arith", dtype=torch.int8)
