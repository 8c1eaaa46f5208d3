"""DatasetTask: rendering (template, chat template, BOS), held-out split, seeded per-epoch shuffling, bad-row
reporting, the VerifiableTask protocol and the make_task registration."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from nemo_jetrl.data import BadRowsWarning, DatasetTask, PromptFormatter, build_dataset_task
from nemo_jetrl.data.config import DataConfig
from nemo_jetrl.environments import Problem, VerifiableTask, make_task
from nemo_jetrl.environments.config import EnvConfig
from nemo_jetrl.environments.math_env import MathEnvironment
from nemo_jetrl.models.tokenizer import build_arith_tokenizer

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def chat_tokenizer() -> PreTrainedTokenizerFast:
    """Character-level tokenizer with ChatML specials (no BOS), like Qwen's."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(32, 127)] + ["\n"]
    core = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token="<|endoftext|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHATML,
    )


def write_rows(path, n=20, extra=()):
    rows = [json.dumps({"problem": f"p{i}", "answer": str(i)}) for i in range(n)] + list(extra)
    path.write_text("\n".join(rows) + "\n")
    return path


def data_cfg(path, **kw):
    cfg = {"dataset_name": str(path), "val_size": 4, "seed": 7, "use_chat_template": False, "shuffle": True}
    cfg.update(kw)
    return DataConfig(**cfg)


def test_template_and_chat_rendering():
    tok = chat_tokenizer()
    plain = PromptFormatter(None, template="Q: {}\nPut the answer in \\boxed{{}}.", use_chat_template=False)
    assert plain.render("1+1?") == "Q: 1+1?\nPut the answer in \\boxed{}."
    chat = PromptFormatter(tok, template="Solve: {}", system_prompt="Be brief.")
    assert chat.render("2+2?") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSolve: 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tok(chat.render("2+2?"))["input_ids"]
    assert ids[0] == tok.convert_tokens_to_ids("<|im_start|>") and ids.count(tok.eos_token_id) == 2


def test_chat_template_bos_appears_once():
    """A tokenizer that adds BOS itself (Llama-3 style) + a template that writes it: the prompt text drops it."""
    tok = build_arith_tokenizer()
    tok.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}={% endfor %}"
    text = PromptFormatter(tok).render("12+34")
    assert text == "12+34="
    assert tok(text)["input_ids"].count(tok.bos_token_id) == 1


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"template": "no placeholder"}, r"exactly one '\{\}' placeholder for the problem, found 0"),
        ({"template": "{} and {}"}, "formatting it failed: IndexError"),
        ({"template": "\\boxed{} {}"}, "formatting it failed"),
        ({"template": "{name}"}, "formatting it failed: KeyError"),
        ({"system_prompt": "sys"}, "data.system_prompt needs data.use_chat_template: true"),
    ],
)
def test_bad_templates_name_the_key(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PromptFormatter(None, use_chat_template=False, **kwargs)


def test_chat_template_missing_is_a_clear_error():
    with pytest.raises(ValueError, match="data.use_chat_template is true but the tokenizer .* has no chat template"):
        PromptFormatter(build_arith_tokenizer())


def test_split_is_disjoint_and_epochs_cover_every_row_once(tmp_path):
    task = build_dataset_task(data_cfg(write_rows(tmp_path / "d.jsonl")), MathEnvironment())
    assert isinstance(task, VerifiableTask)
    val = {p.answer for p in task.validation()}
    assert len(val) == 4 and task.validation(2) == task.validation()[:2]
    train = [p.answer for step in range(4) for p in task.train_batch(step, 4)]  # 16 rows = exactly one epoch
    assert Counter(train) == Counter({str(i): 1 for i in range(20) if str(i) not in val})
    assert train != sorted(train, key=int), "shuffle: true kept the file order"
    epoch2 = [p.answer for step in range(4, 8) for p in task.train_batch(step, 4)]
    assert sorted(epoch2) == sorted(train) and epoch2 != train  # reshuffled per epoch
    assert task.data_position(5, 4) == {"epoch": 1, "offset": 4, "prompts_consumed": 20}


def test_batches_are_a_pure_function_of_seed_and_step(tmp_path):
    path = write_rows(tmp_path / "d.jsonl")
    a = build_dataset_task(data_cfg(path), MathEnvironment())
    b = build_dataset_task(data_cfg(path), MathEnvironment())
    assert b.train_batch(3, 5) == a.train_batch(3, 5)  # b never produced steps 0..2: resume sees the same data
    assert a.validation() == b.validation()
    c = build_dataset_task(data_cfg(path, seed=8), MathEnvironment())
    assert c.train_batch(3, 5) != a.train_batch(3, 5)
    ordered = build_dataset_task(data_cfg(path, shuffle=False), MathEnvironment())
    answers = [p.answer for p in ordered.train_batch(0, 16)]
    assert answers == sorted(answers, key=int)


def test_separate_validation_file_and_too_long_prompts(tmp_path):
    tok = chat_tokenizer()
    train = write_rows(tmp_path / "t.jsonl", n=6, extra=[json.dumps({"problem": "x" * 100, "answer": "1"})])
    val = write_rows(tmp_path / "v.jsonl", n=3)
    cfg = data_cfg(train, val_dataset_name=str(val), use_chat_template=True)
    with pytest.warns(
        BadRowsWarning, match=r"1 of 7 rows of .*t.jsonl skipped: 1 prompt longer than 40 tokens \(row 7\)"
    ):
        task = build_dataset_task(cfg, MathEnvironment(), tokenizer=tok, max_prompt_tokens=40)
    assert len(task.train_problems) == 6 and [p.answer for p in task.validation()] == ["0", "1", "2"]
    assert task.validation()[0].prompt.startswith("<|im_start|>user\np0")
    # without the loop's limit (generation.interfaces.max_prompt_length folds it in), data.max_input_seq_length
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        task = build_dataset_task(
            data_cfg(train, val_dataset_name=str(val), use_chat_template=True, max_input_seq_length=200),
            MathEnvironment(),
            tokenizer=tok,
            max_prompt_tokens=None,
        )
    assert len(task.train_problems) == 7


def test_one_warning_for_all_bad_rows_of_both_sources(tmp_path):
    train = write_rows(tmp_path / "t.jsonl", n=6, extra=["{bad", json.dumps({"problem": "q"})])
    val = write_rows(tmp_path / "v.jsonl", n=2, extra=[json.dumps({"answer": "1"})])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_dataset_task(data_cfg(train, val_dataset_name=str(val)), MathEnvironment())
    messages = [str(w.message) for w in caught if issubclass(w.category, BadRowsWarning)]
    assert len(messages) == 1
    assert "2 of 8 rows of" in messages[0] and "1 malformed JSON (row 7)" in messages[0]
    assert "1 missing 'answer' (row 8)" in messages[0] and "1 missing 'problem' (row 3)" in messages[0]


def test_val_size_must_leave_training_rows(tmp_path):
    with pytest.raises(ValueError, match=r"data.val_size \(20\) must be smaller than the 20 usable rows"):
        build_dataset_task(data_cfg(write_rows(tmp_path / "d.jsonl"), val_size=20), MathEnvironment())


def test_score_and_env_metrics_pass_through(tmp_path):
    task = DatasetTask([Problem("p", "1")], [], MathEnvironment())
    assert task.score(["\\boxed{1}", "none"], ["1", "1"]).tolist() == [1.0, 0.0]
    assert task.pop_metrics()["parse_failures"] == 1.0
    with pytest.raises(ValueError, match="train_batch step must be an int >= 0"):
        task.train_batch(-1, 2)


def test_make_task_builds_a_math_task_for_files_and_keeps_arithmetic(tmp_path):
    path = write_rows(tmp_path / "d.jsonl")
    env = {
        "math": {
            "correct_reward": 2.0,
            "wrong_reward": 0.0,
            "no_answer_reward": -1.0,
            "format_reward": 0.0,
            "answer_format": "boxed",
            "verify_timeout_s": 5.0,
        }
    }
    task = make_task(data_cfg(path, input_key="problem", output_key="answer"), EnvConfig(**env), tokenizer=None)
    assert isinstance(task, DatasetTask)
    assert task.score(["\\boxed{3}", "x"], ["3", "3"]).tolist() == [2.0, -1.0]
    assert type(make_task(DataConfig(), EnvConfig())).__name__ == "ArithmeticTask"
