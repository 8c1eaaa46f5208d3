"""The `auto` values of `policy.train_cuda_graphs` and `policy.generation.matched_kernels` (policy/auto_switches.py):
on where correct, off with one start-up line where not; the self-check's verdict switches the model or leaves it."""

from __future__ import annotations

import pytest
import torch

from benchmarks.common import policy_config
from nemo_jetrl.models import matched_check
from nemo_jetrl.models.batch_invariant import MATCHED_PARTS, NO_EXACT_PARTS, exact_parts
from nemo_jetrl.models.tiny import random_tiny_qwen3
from nemo_jetrl.policy.auto_switches import (
    LONGEST_CAPTURED_SEQUENCE,
    apply_matched_kernels,
    matched_kernels_blocker,
    resolve_train_cuda_graphs,
    worker_switch_lines,
)
from nemo_jetrl.policy.config import PolicyConfig
from nemo_jetrl.policy.memory_estimate import TrainerMemorySettings
from nemo_jetrl.policy.native import NativePolicy
from nemo_jetrl.precision import Fp8Linear, FpropKernel, PrecisionRecipe, convert_to_fp8

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _cfg(**overrides) -> PolicyConfig:
    """The benchmarks' `policy` section (typed, a fresh one per call) with both switches on auto."""
    return policy_config(train_cuda_graphs="auto", generation={"matched_kernels": "auto"}, **overrides)


def test_train_cuda_graphs_auto_is_on_where_captured_micro_batches_are_correct():
    cfg = _cfg()
    assert resolve_train_cuda_graphs(cfg, CUDA) == (True, None)  # a device object: no GPU needed
    assert resolve_train_cuda_graphs(cfg, CPU) == (
        False,
        "policy.train_cuda_graphs: auto -> off: the trainer runs on cpu",
    )
    cfg.generation.deterministic = True
    assert resolve_train_cuda_graphs(cfg, CUDA) == (
        False,
        "policy.train_cuda_graphs: auto -> off: policy.generation.deterministic: true (the exact mode's trainer runs "
        "eagerly)",
    )
    cfg.generation.deterministic = False
    cfg.max_total_sequence_length = LONGEST_CAPTURED_SEQUENCE + 512  # 8K-token responses
    assert resolve_train_cuda_graphs(cfg, CUDA) == (
        False,
        "policy.train_cuda_graphs: auto -> off: policy.max_total_sequence_length 8704 > 8192: the captured pool "
        "keeps a micro-batch's activations reserved beside the eager passes' (a captured FP8+KV run at 8K ran out of "
        "memory), and micro-batches this long spend little of their time launching kernels (true forces it)",
    )
    settings = TrainerMemorySettings.from_policy(cfg, cuda=True)
    assert not settings.graphs  # the preflight counts no captured pool there
    cfg.max_total_sequence_length = LONGEST_CAPTURED_SEQUENCE
    assert resolve_train_cuda_graphs(cfg, CUDA) == (True, None)
    assert TrainerMemorySettings.from_policy(cfg, cuda=True).graphs
    cfg.max_total_sequence_length = 8704
    # model_copy: past the section's validators (true with the exact mode is refused there), as code can build it
    assert resolve_train_cuda_graphs(cfg.model_copy(update={"train_cuda_graphs": False}), CUDA) == (False, None)
    assert resolve_train_cuda_graphs(cfg.model_copy(update={"train_cuda_graphs": True}), CUDA) == (True, None)
    with pytest.raises(ValueError, match="policy.train_cuda_graphs: true needs a CUDA device, the trainer runs on cpu"):
        resolve_train_cuda_graphs(cfg.model_copy(update={"train_cuda_graphs": True}), CPU)


@pytest.mark.parametrize(
    ("section", "key", "value", "reason"),
    [
        ("generation", "deterministic", True, "policy.generation.deterministic: true already runs its kernels"),
        ("generation", "backend", "vllm", "policy.generation.backend: vllm (the native engine's path)"),
        ("generation", "precision", "bf16", "the trainer and the rollout run different precisions"),
        ("generation", "kv_cache_dtype", "fp8", "an FP8 KV cache without policy.fp8_cfg.train_kv_fake_quant"),
        (None, "train_causal_attention", True, "policy.train_causal_attention: true"),
        (None, "fused_train_kernels", False, "policy.fused_train_kernels: false"),
        ("fp8_cfg", "fp8_recipe", "rowwise", "policy.fp8_cfg.fp8_recipe: rowwise (matched kernels need blockwise)"),
    ],
)
def test_matched_kernels_auto_is_off_where_the_config_rules_it_out(section, key, value, reason):
    cfg = _cfg()
    cfg.precision = cfg.generation.precision = "fp8"
    assert matched_kernels_blocker(cfg) is None
    setattr(getattr(cfg, section) if section else cfg, key, value)
    assert matched_kernels_blocker(cfg) == reason
    model = random_tiny_qwen3(0, num_layers=1)
    assert apply_matched_kernels(model, cfg, PrecisionRecipe.preset("jetrl"), CPU, None) == (
        False, f"policy.generation.matched_kernels: auto -> off: {reason}"
    )  # fmt: skip
    assert exact_parts(model) == NO_EXACT_PARTS


@pytest.mark.parametrize("problem", [None, "lm_head: the rollout's rows of a 3-row product differ"])
def test_the_self_check_decides_auto_and_a_refusal_leaves_the_fast_path(monkeypatch, problem):
    seen = []
    monkeypatch.setattr(
        matched_check, "matched_kernels_problem", lambda model, *a, **k: seen.append(exact_parts(model)) or problem
    )
    model = random_tiny_qwen3(0, num_layers=1)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    on, line = apply_matched_kernels(model, _cfg(), PrecisionRecipe.preset("jetrl"), CPU, torch.bfloat16)
    assert seen == [MATCHED_PARTS]  # the check ran on the switched model
    assert on == (problem is None) and exact_parts(model) == (MATCHED_PARTS if on else NO_EXACT_PARTS)
    assert all(m.fprop_kernel is FpropKernel.AUTO for m in model.modules() if isinstance(m, Fp8Linear))
    key = "policy.generation.matched_kernels: auto"
    expected = f"{key} -> off: not row-invariant on cpu: {problem} (true forces it)" if problem else (
        f"{key} -> on: every product row-invariant on cpu (rollout logprobs == trainer's, bitwise)"
    )  # fmt: skip
    assert line == expected


def test_native_policy_resolves_both_and_prints_one_line_each(capsys):
    policy = NativePolicy(
        _cfg(master_dtype="float32"), PrecisionRecipe.preset("jetrl"), CPU, model=random_tiny_qwen3(0)
    )
    lines = capsys.readouterr().out.strip().splitlines()
    assert policy.train_graphs is None and lines[-1] == "policy.train_cuda_graphs: auto -> off: the trainer runs on cpu"
    assert len(lines) == 2 and lines[0].startswith("policy.generation.matched_kernels: auto -> ")
    on = lines[0].startswith("policy.generation.matched_kernels: auto -> on")  # the CPU's emulated GEMMs decide
    assert exact_parts(policy.model) == (MATCHED_PARTS if on else NO_EXACT_PARTS)


def test_ray_workers_take_train_graphs_auto_as_off_and_refuse_what_they_cannot_run():
    """The matched kernels' `auto` is not decided here: Ray's workers run the self-check together (their line comes
    back from rank 0); train graphs' `auto` is off on the workers (one line)."""
    cfg = _cfg()
    assert matched_kernels_blocker(cfg) is None
    assert worker_switch_lines(cfg, "ray") == [
        "policy.train_cuda_graphs: auto -> off: cluster.backend: ray (its workers' trainers run eagerly)",
    ]
    cfg.generation.matched_kernels, cfg.train_cuda_graphs = True, False
    assert worker_switch_lines(cfg, "ray") == []
    cfg.dtensor_cfg.tensor_parallel_size = 2
    with pytest.raises(ValueError, match="matched_kernels: true with policy.dtensor_cfg.tensor_parallel_size 2"):
        worker_switch_lines(cfg, "ray")
    with pytest.raises(ValueError, match="policy.train_cuda_graphs needs the local backend"):
        worker_switch_lines(cfg.model_copy(update={"train_cuda_graphs": True}), "ray")


class _Ranks:
    """Two torchrun ranks as `apply_matched_kernels` sees them: this one, and the other's self-check verdict."""

    world_size = 2

    def __init__(self, other: str | None) -> None:
        self.other, self.asked = other, []

    def first_of(self, mine):  # ParallelPlan.first_of: the first rank's non-None value, "(rank r)" appended
        self.asked.append(mine)
        for rank, found in enumerate((mine, self.other)):
            if found is not None:
                return f"{found} (rank {rank})"
        return None


@pytest.mark.parametrize("other", [None, "layers.0.mlp.down_proj: the rollout's rows of a 8-row product differ"])
def test_torchrun_ranks_run_the_self_check_each_and_take_one_verdict(monkeypatch, other):
    monkeypatch.setattr(matched_check, "matched_kernels_problem", lambda *a, **k: None)  # this rank's check passes
    model = random_tiny_qwen3(0, num_layers=1)
    convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
    ranks = _Ranks(other)
    on, line = apply_matched_kernels(model, _cfg(), PrecisionRecipe.preset("jetrl"), CPU, torch.bfloat16, ranks)
    assert ranks.asked == [None]  # every rank asks (a collective), with its own verdict
    assert on == (other is None) and exact_parts(model) == (MATCHED_PARTS if on else NO_EXACT_PARTS)
    key = "policy.generation.matched_kernels: auto"
    assert line == (f"{key} -> on: every product row-invariant on cpu (2 ranks) (rollout logprobs == trainer's, "
                    "bitwise)" if on else f"{key} -> off: not row-invariant on cpu (2 ranks): {other} (rank 1) "
                    "(true forces it)")  # fmt: skip
    # torchrun: the ranks' check speaks (no placement line); tensor-parallel shards rule it out before any check
    assert worker_switch_lines(_cfg(), "torchrun") == [
        "policy.train_cuda_graphs: auto -> off: cluster.backend: torchrun (its workers' trainers run eagerly)"
    ]
    tp2 = _cfg(dtensor_cfg={"tensor_parallel_size": 2})
    reason = "policy.dtensor_cfg.tensor_parallel_size 2 (the check does not cover tensor-parallel shards)"
    assert matched_kernels_blocker(tp2) == reason
    tp_ranks = _Ranks(None)
    got = apply_matched_kernels(random_tiny_qwen3(0, num_layers=1), tp2, PrecisionRecipe.preset("jetrl"), CPU,
                                torch.bfloat16, tp_ranks)  # fmt: skip
    assert got == (False, f"{key} -> off: {reason}") and tp_ranks.asked == []  # decided by the config alike
