"""A scripted GRPO task whose reward identifies (prompt, response), and checks of what reaches `policy.train`.

Use it to test the loop's wiring (grouping, advantages, dropped groups; next: dynamic sampling, several optimizer
steps per GRPO step, reordering rollouts):

    run = grpo.setup(cfg, task=ScriptedTask())
    calls = record_train(run)                    # every TrainBatch policy.train receives (still trains)
    metrics = grpo.grpo_step(run, step, Timer(), RunProgress(1, enabled=False))
    check_train_batch(calls[-1], run.policy.tokenizer, run.cfg.grpo, run.task.prompts(step, n))

The expected advantages are recomputed from the decoded rows alone (prompt text -> group, response text ->
reward), in float64 with NeMo-RL's formulas written out here, so a batch whose rewards, advantages, groups or
logprob rows were paired with the wrong sequence fails. `ScriptedEngine` replaces the sampled responses with given
ones (e.g. lengths that reward shaping penalizes).
"""

from __future__ import annotations

import statistics
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from nemo_jetrl.algorithms.config import GrpoConfig
from nemo_jetrl.environments.interfaces import Problem
from nemo_jetrl.generation.interfaces import GenerationOutput
from nemo_jetrl.policy.interfaces import TrainBatch

EPS = 1e-6  # advantages.group_advantages' default eps
# grpo_tiny.yaml cut to a few-second GRPO step on 2 CPU cores: 8 prompts x 4 samples, no validation, no plots
SMALL_TINY_RUN = [
    "grpo.num_prompts_per_step=8",
    "grpo.num_generations_per_prompt=4",
    "policy.train_micro_batch_size=16",
    "policy.logprob_batch_size=32",
    "grpo.val_period=0",
    "grpo.val_at_start=false",
    "logger.tensorboard_enabled=false",
    "logger.plot_period=0",
]


def scripted_reward(answer: str, response: str) -> float:
    """Reward of `response` to the prompt whose answer is `answer` ("<id>" or "<id>:const").

    Constant prompts give every response the same reward (a zero-std group); the others hash (prompt, response)
    to one of 8 levels, so two samples of a group almost always differ and a reward moved to another row shows.
    """
    pid, _, kind = answer.partition(":")
    if kind == "const":
        return int(pid) % 5 / 4
    return zlib.crc32(f"{pid}|{response}".encode()) % 8 / 7


class ScriptedTask:
    """`VerifiableTask` with distinct prompts of varying length per step; every `const_every`-th prompt is constant."""

    def __init__(self, const_every: int = 3) -> None:
        self.const_every = const_every
        self.scored: list[tuple[list[str], list[str]]] = []  # (responses, answers) of every score() call

    def prompts(self, step: int, n: int) -> list[Problem]:
        out = []
        for i in range(n):
            pid = step * 1000 + i
            const = self.const_every > 0 and i % self.const_every == self.const_every - 1
            text = f"{step}+{i * 37 % 1000}=" if i % 2 else f"{i}+{step}="  # 4 to 8 characters: left padding varies
            out.append(Problem(prompt=text, answer=f"{pid}:const" if const else str(pid)))
        return out

    def train_batch(self, step: int, n: int) -> list[Problem]:
        return self.prompts(step, n)

    def validation(self, max_n: int | None = None) -> list[Problem]:
        return self.prompts(99, 4 if max_n is None else min(4, max_n))

    def score(self, responses: Sequence[str], answers: Sequence[str]) -> torch.Tensor:
        self.scored.append((list(responses), list(answers)))
        return torch.tensor([scripted_reward(a, r) for r, a in zip(responses, answers)], dtype=torch.float32)


class ScriptedEngine:
    """A rollout engine whose responses are given: `responses[prompt text]` lists the G response texts of that
    prompt's group, in order (each completed by the stop token); everything but `generate` is the real engine's.
    The rollout logprobs are the real engine's scores of these tokens, so trainer and rollout still agree."""

    def __init__(self, engine, tokenizer, responses: dict[str, list[str]]) -> None:
        self.engine, self.tokenizer, self.responses = engine, tokenizer, responses

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def generate(self, prompt_ids: list[list[int]], *, greedy: bool = False, generator=None) -> GenerationOutput:
        tok, served = self.tokenizer, {}
        rows = []
        for ids in prompt_ids:
            text = tok.decode(ids, skip_special_tokens=True)
            k = served[text] = served.get(text, -1) + 1
            response = tok(self.responses[text][k], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows.append((list(ids), response))
        width = max(len(p) for p, _ in rows)
        total = width + max(len(r) for _, r in rows)
        ids = torch.full((len(rows), total), tok.pad_token_id, dtype=torch.long)  # [B, S]
        attention, response = torch.zeros_like(ids), torch.zeros_like(ids)
        for i, (prompt, resp) in enumerate(rows):
            ids[i, width - len(prompt) : width] = torch.tensor(prompt)
            ids[i, width : width + len(resp)] = torch.tensor(resp)
            attention[i, width - len(prompt) : width + len(resp)] = 1
            response[i, width : width + len(resp)] = 1
        logprobs = self.engine.score(ids, attention, width).float() * response  # [B, S]
        return GenerationOutput(
            input_ids=ids,
            attention_mask=attention,
            response_mask=response,
            generation_logprobs=logprobs,
            prompt_length=width,
            response_lengths=response.sum(-1),
            finished=torch.ones(len(rows), dtype=torch.bool),
        )


def record_train(run, passthrough: bool = True) -> list[TrainBatch]:
    """Wrap `run.policy.train` (one TrainBatch per optimizer step): every call that gets rows appends its batch
    (cloned; the configs here take one optimizer step per GRPO step) to the returned list."""
    calls: list[TrainBatch] = []
    real = run.policy.train

    def train(steps: list[TrainBatch], loss_fn) -> dict[str, float]:
        assert len(steps) <= 1, "the harness configs take one optimizer step per GRPO step"
        out = real(steps, loss_fn) if passthrough else {}
        if steps:  # after the call: with prev_logprobs_source train_forward the trainer fills prev_logprobs
            calls.append(steps[0].select(slice(None)))
        return out

    run.policy.train = train
    return calls


def decode_rows(batch: TrainBatch, tokenizer) -> list[tuple[str, str]]:
    """(prompt text, response text) of each row, from the batch's own tokens and masks."""
    rows = []
    for ids, attn, resp in zip(batch.input_ids, batch.attention_mask.bool(), batch.response_mask.bool()):
        prompt = tokenizer.decode(ids[attn & ~resp].tolist(), skip_special_tokens=True)
        rows.append((prompt, tokenizer.decode(ids[resp].tolist(), skip_special_tokens=True)))
    return rows


def reference_advantages(rewards: Sequence[float], leave_one_out: bool, normalize: bool) -> list[float]:
    """One group's advantages, float64: baseline = mean (of the others with leave-one-out); divided by the
    Bessel std of the same samples + EPS where that std > 0; an all-equal group gets 0."""
    if len(set(rewards)) <= 1:
        return [0.0] * len(rewards)
    out = []
    for i, r in enumerate(rewards):
        pool = [x for j, x in enumerate(rewards) if j != i] if leave_one_out else list(rewards)
        baseline = statistics.fmean(pool)
        std = statistics.stdev(pool) if len(pool) >= 2 else 0.0
        out.append((r - baseline) / (std + EPS) if normalize and std > 0 else r - baseline)
    return out


@dataclass
class BatchCheck:
    """What `check_train_batch` found: rewards by prompt (every sample, kept or not) and the kept prompts."""

    rewards: dict[str, list[float]]
    kept_prompts: list[str]


def check_train_batch(
    batch: TrainBatch | None,
    tokenizer,
    grpo_cfg: GrpoConfig,
    problems: Sequence[Problem],
    responses_by_prompt: dict[str, list[str]],
    logprob_atol: float | None = None,
) -> BatchCheck:
    """Assert that `batch` (what policy.train got; None if it was not called) holds exactly the kept groups of
    `problems`, each complete and contiguous, with advantages recomputed independently from the decoded rows.

    `responses_by_prompt`: every sampled response per prompt text (from the task's score call), to know which
    groups had all-equal rewards. `logprob_atol`: if set, each row's trainer logprobs must match its rollout
    logprobs within it (catches logprob rows paired with another sequence).
    """
    group = grpo_cfg.num_generations_per_prompt
    answer_of = {p.prompt: p.answer for p in problems}
    rewards = {p: [scripted_reward(answer_of[p], r) for r in rs] for p, rs in responses_by_prompt.items()}
    assert sorted(rewards) == sorted(answer_of), "the rollout did not sample every prompt of the step"
    assert all(len(v) == group for v in rewards.values()), "a prompt got a wrong number of samples"
    dropped = {p for p, r in rewards.items() if grpo_cfg.drop_zero_advantage_groups and len(set(r)) == 1}
    kept = [p.prompt for p in problems if p.prompt not in dropped]
    if not kept:
        assert batch is None, "policy.train ran on a batch with no kept group"
        return BatchCheck(rewards, kept)
    assert batch is not None, "policy.train was not called although groups had signal"
    rows = decode_rows(batch, tokenizer)
    assert len(rows) == group * len(kept), (len(rows), group, len(kept))
    order = [rows[i][0] for i in range(0, len(rows), group)]
    assert order == kept, f"groups out of order or wrong groups kept: {order} vs {kept}"
    loo, norm = grpo_cfg.use_leave_one_out_baseline, grpo_cfg.normalize_rewards
    for g, prompt in enumerate(kept):
        block = rows[g * group : (g + 1) * group]
        assert all(p == prompt for p, _ in block), f"group {g} mixes prompts: {[p for p, _ in block]}"
        assert sorted(r for _, r in block) == sorted(responses_by_prompt[prompt]), f"group {prompt!r} lost a sample"
        got_rewards = [scripted_reward(answer_of[prompt], r) for _, r in block]
        expected = reference_advantages(got_rewards, loo, norm)
        got = batch.advantages[g * group : (g + 1) * group].double()
        torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-5, atol=1e-5)
    if logprob_atol is not None:
        m = batch.response_mask.bool()
        diff = (batch.prev_logprobs - batch.generation_logprobs).abs().where(m, torch.zeros(()))  # [B, S]
        assert float(diff.max()) <= logprob_atol, f"trainer vs rollout logprobs differ by {float(diff.max())}"
    return BatchCheck(rewards, kept)


def responses_by_prompt(task: ScriptedTask, problems: Sequence[Problem], call: int = -1) -> dict[str, list[str]]:
    """The responses of `task`'s `call`-th score call, by prompt text (answers map back to prompts)."""
    prompt_of = {p.answer: p.prompt for p in problems}
    out: dict[str, list[str]] = {}
    responses, answers = task.scored[call]
    for r, a in zip(responses, answers):
        out.setdefault(prompt_of[a], []).append(r)
    return out
