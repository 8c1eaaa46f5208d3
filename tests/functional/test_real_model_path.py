"""The real-model path on a small stand-in: a locally built Qwen3 checkpoint directory (random weights, dims multiples
of 128) with a chat-template tokenizer loads, trains 2 GRPO steps on a jsonl math set with math-verify rewards,
checkpoints, exports and reloads with transformers; plus the documented behaviour for bad inputs."""

from __future__ import annotations

import json
import shutil
import string
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from nemo_jetrl.algorithms.grpo import run_grpo
from nemo_jetrl.algorithms.grpo_checkpoint import export_checkpoint
from nemo_jetrl.config import load_config
from nemo_jetrl.data import BadRowsWarning
from nemo_jetrl.models.loading import load_model_and_tokenizer
from nemo_jetrl.schema import validate_config
from nemo_jetrl.utils.checkpoint import CorruptCheckpointWarning

REPO = Path(__file__).resolve().parents[2]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB_SIZE = 128


def build_chat_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer (printable ASCII + newline) with ChatML specials and a chat template, offline."""
    tokens = SPECIALS + list(string.printable[:95]) + ["\n"]
    tokens += [f"<reserved_{i}>" for i in range(VOCAB_SIZE - len(tokens))]
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML,
        padding_side="left",
    )


def build_qwen3_dir(path: Path, seed: int = 0) -> Path:
    """A 2-layer Qwen3 (hidden 128, MLP 256, 1 head x 128) with random weights + the chat tokenizer, saved as HF."""
    tokenizer = build_chat_tokenizer()
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=128,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    Qwen3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


PROBLEMS = [(f"What is {a} + {b}?", str(a + b)) for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (6, 3), (7, 0), (4, 4)]]
PROBLEMS += [("Simplify 2/4.", "\\frac{1}{2}"), ("What is 3*3?", "9"), ("Compute 10-7.", "3")]


def write_math_jsonl(path: Path) -> Path:
    lines = [json.dumps({"problem": p, "answer": a}) for p, a in PROBLEMS]
    lines.insert(2, '{"problem": "broken line", "answer": ')  # malformed JSON
    lines.insert(5, json.dumps({"problem": "What is 1+1?"}))  # missing answer
    lines.insert(7, json.dumps({"problem": "   ", "answer": "1"}))  # empty problem
    lines.append(json.dumps({"problem": "x" * 200, "answer": "1"}))  # prompt too long for the sequence budget
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("real_model")
    build_qwen3_dir(root / "qwen3-small")
    write_math_jsonl(root / "math.jsonl")
    return root


def math_config(root: Path, *extra: str):
    overrides = [
        f"policy.model_name={root / 'qwen3-small'}",
        f"data.dataset_name={root / 'math.jsonl'}",
        "data.val_size=2",
        "grpo.num_prompts_per_step=4",
        "grpo.num_generations_per_prompt=4",
        "grpo.max_num_steps=2",
        "grpo.val_period=2",
        "grpo.val_at_start=false",
        "grpo.max_val_samples=2",
        "policy.train_micro_batch_size=16",
        "policy.logprob_batch_size=16",
        "policy.max_total_sequence_length=64",
        "policy.generation.max_new_tokens=12",
        "policy.optimizer.lr=1e-3",
        "env.math.answer_format=any",
        "env.math.format_reward=0.1",
        f"logger.log_dir={root / 'logs'}",
        "logger.tensorboard_enabled=false",
        "checkpointing.enabled=true",
        f"checkpointing.checkpoint_dir={root / 'ckpt'}",
        "checkpointing.save_period=1",
        "cluster.device=cpu",
        "cluster.num_cpu_threads=2",
        *extra,
    ]
    return validate_config(load_config(REPO / "examples" / "configs" / "grpo_base.yaml", overrides))


@pytest.fixture(scope="module")
def trained(workspace):
    """2 GRPO steps on the jsonl set: (run_grpo result, BadRowsWarning messages)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_grpo(math_config(workspace))
    return result, [str(w.message) for w in caught if issubclass(w.category, BadRowsWarning)]


@pytest.mark.slow
def test_local_qwen3_trains_checkpoints_exports_and_reloads(workspace, trained):
    model, tokenizer = load_model_and_tokenizer(str(workspace / "qwen3-small"))
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    initial = model.state_dict()

    result, bad_rows = trained
    assert len(bad_rows) == 1, bad_rows  # one warning with all the counts
    message = bad_rows[0]
    assert "4 of 14 rows" in message and "math.jsonl" in message
    for part in ("1 malformed JSON (row 3)", "1 missing 'answer' (row 6)", "1 empty 'problem' (row 8)"):
        assert part in message
    assert "1 prompt longer than 52 tokens (row 14)" in message

    history = result["history"]
    assert len(history) == 2
    # The seeded random-weight model answers with noise: 15 of its 16 responses hold no parseable answer at both
    # steps (pinned; a counter that is not reset per step reads 15, 30, one that never counts 0, 0); every gold
    # answer parses.
    assert [m["env/parse_failures"] for m in history] == [15.0, 15.0]
    for metrics in history:
        assert metrics["env/num_scored"] == 16.0
        assert metrics["env/gold_parse_failures"] == 0.0 and metrics["env/verify_timeouts"] == 0.0
        assert metrics["nonfinite_skipped"] == 0.0
    assert any(m["kept_fraction"] > 0 and torch.isfinite(torch.tensor(m["grad_norm"])) for m in history)
    lines = [json.loads(s) for s in (workspace / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert any("train/env/parse_failures" in line for line in lines)
    assert any("validation/env/parse_failures" in line for line in lines)

    ckpt = sorted(p.name for p in (workspace / "ckpt").glob("step_*"))
    assert ckpt == ["step_1", "step_2"]
    state = torch.load(workspace / "ckpt" / "step_2" / "state.pt", weights_only=False)
    assert state["step"] == 2 and state["data"]["prompts_consumed"] == 8 and "torch" in state["rng"]
    assert state["config"]["data"]["dataset_name"].endswith("math.jsonl")
    trained = state["policy"]["model"]
    assert any(not torch.equal(trained[k], initial[k]) for k in initial), "2 GRPO steps left the weights unchanged"
    assert state["policy"]["optimizer"]["state"], "no optimizer state saved"

    out = export_checkpoint(workspace / "ckpt", workspace / "export")
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    assert reloaded.dtype == torch.bfloat16
    for name, tensor in reloaded.state_dict().items():
        assert torch.equal(tensor, trained[name].to(torch.bfloat16)), name
    reloaded_tok = AutoTokenizer.from_pretrained(out)
    assert reloaded_tok.chat_template == CHATML
    ids = torch.tensor([reloaded_tok(prompt)["input_ids"]])
    assert torch.isfinite(reloaded(ids).logits).all()

    fp8_out = export_checkpoint(workspace / "ckpt" / "step_2", workspace / "export_fp8", fp8=True)
    tensors = load_file(fp8_out / "model.safetensors")
    assert tensors["model.layers.1.mlp.down_proj.weight"].dtype == torch.float8_e4m3fn
    assert tensors["model.layers.1.mlp.down_proj.weight_scale_inv"].shape == (1, 2)


@pytest.mark.parametrize(
    "remove, message",
    [
        ("model.safetensors", r"has no weights: expected one of \['model.safetensors'"),
        ("tokenizer.json", r"has no tokenizer"),
        ("config.json", r"has no config.json"),
    ],
)
def test_missing_model_files_fail_before_any_weight_is_read(workspace, tmp_path, remove, message):
    broken = shutil.copytree(workspace / "qwen3-small", tmp_path / "broken")
    (broken / remove).unlink()
    if remove == "tokenizer.json":
        (broken / "tokenizer_config.json").unlink()
    with pytest.raises(ValueError, match=message):
        load_model_and_tokenizer(str(broken))


def test_unblockable_dims_are_refused_from_config_before_loading_weights(workspace, tmp_path):
    broken = shutil.copytree(workspace / "qwen3-small", tmp_path / "odd")
    config = json.loads((broken / "config.json").read_text())
    config["intermediate_size"] = 200  # the weights on disk no longer match: proves they are never read
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"layer 'model.layers.1.mlp.gate_proj' \(200x128\) cannot be blocked"):
        load_model_and_tokenizer(str(broken), fp8_block=128, first_fp8_layer=1)


@pytest.mark.slow
def test_corrupt_latest_checkpoint_is_skipped_and_the_previous_one_resumes(workspace, trained, tmp_path, capsys):
    """A flipped byte in the newest checkpoint: warned about, never loaded; the run resumes from the one before."""
    root = tmp_path / "run"
    shutil.copytree(workspace / "ckpt", root / "ckpt")
    state_file = root / "ckpt" / "step_2" / "state.pt"
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state_file.write_bytes(bytes(data))
    (root / "qwen3-small").symlink_to(workspace / "qwen3-small")
    (root / "math.jsonl").symlink_to(workspace / "math.jsonl")
    cfg = math_config(root, "grpo.val_period=0")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_grpo(cfg)
    skipped = [str(w.message) for w in caught if issubclass(w.category, CorruptCheckpointWarning)]
    assert len(skipped) == 1 and "step_2" in skipped[0] and "sha256" in skipped[0]
    assert "resumed from step 1" in capsys.readouterr().err
    assert len(result["history"]) == 1  # only step 2 ran again
    assert sorted(p.name for p in (root / "ckpt").glob("step_*") if "." not in p.name) == ["step_1", "step_2"]
    assert (root / "ckpt" / "step_2" / "state.pt").read_bytes() != bytes(data)  # re-saved, valid again
    (aside,) = (root / "ckpt").glob("step_2.aside.*")  # issue 46: the damaged one is kept, not deleted
    assert (aside / "state.pt").read_bytes() == bytes(data)
