"""The start-up memory preflight (algorithms/memory_preflight.py, policy/memory_estimate.py): the estimate's parts at
the Qwen3 shapes, token budgets derived so that the step fits, one-line refusals that name the keys to change, a
CPU run that only reports, and the CLI's refusal (exit 2, one line, nothing run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_jetrl.algorithms.memory_preflight import MemoryPreflightError, memory_preflight
from nemo_jetrl.config import load_config
from nemo_jetrl.models.random_checkpoint import SHAPES
from nemo_jetrl.policy.memory_estimate import GIB, ModelShape, TrainerMemorySettings, layer_bytes
from nemo_jetrl.schema import MasterConfig, validate_config

ROOT = Path(__file__).resolve().parents[3]
CONFIGS = ROOT / "examples" / "configs"
H200 = int(139.8 * GIB)
SHAPE_1P7B, SHAPE_8B = ModelShape.from_config(SHAPES["qwen3-1.7b"]), ModelShape.from_config(SHAPES["qwen3-8b"])
LONG_8K = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=8",
           "policy.max_total_sequence_length=8704", "policy.generation.max_new_tokens=8192"]  # fmt: skip
LONG_16K = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=8", "cluster.gpus_per_node=1",
            "policy.max_total_sequence_length=16896", "policy.generation.max_new_tokens=16384"]  # fmt: skip


def _cfg(name: str, overrides: list[str]) -> MasterConfig:
    return validate_config(load_config(CONFIGS / name, overrides))


def test_shapes_and_per_layer_bytes():
    assert SHAPE_1P7B.params() == 1_720_574_976 and SHAPE_8B.params() == 8_190_735_360  # the published counts
    policy = _cfg("grpo_math_8B_bf16.yaml", ["policy.master_dtype=bfloat16"]).policy
    s = TrainerMemorySettings.from_policy(policy)
    # 8B, BF16 master, packed, K/V repeated to the query heads: residuals 16,384 + attention 32,896 + BF16 inputs
    # and q/k 51,200 (FP8: X^T 25,344 + the q/k/v buffer 12,288) + gate/up 49,152 bytes per token
    assert layer_bytes(SHAPE_8B, s, fp8=False) == 149_632
    assert layer_bytes(SHAPE_8B, s, fp8=True) == 134_016
    assert layer_bytes(SHAPE_8B, s, fp8=False, grouped_kv=True) == 149_632 - 2 * 2 * (4096 - 1024)


def test_a_null_packing_budget_is_derived_to_fit_and_written_into_the_config():
    cfg = _cfg("grpo_math_random_1p7B_bf16.yaml", LONG_8K)  # FP32 master, no activation checkpointing
    result = memory_preflight(cfg, shape=SHAPE_1P7B, capacity=H200)
    budget = cfg.policy.sequence_packing.train_mb_tokens
    # train_cuda_graphs: auto does not capture 8,704-token sequences (auto_switches.LONGEST_CAPTURED_SEQUENCE)
    assert result.derived == {"policy.sequence_packing.train_mb_tokens": budget}
    assert not result.estimate.grads_kept and cfg.policy.train_cuda_graphs == "auto"
    assert 8704 <= budget < 4 * 8704 and budget % 64 == 0  # below the shipped 4 x 8,704 tokens, one sequence fits
    usable = int(0.9 * H200)
    assert result.estimate.peak("train", budget) <= usable < result.estimate.peak("train", budget + 2 * 64)
    assert result.peaks["train"] == result.estimate.peak("train", budget)
    assert cfg.policy.sequence_packing.logprob_mb_tokens is None  # 8 x 8,704 no-grad tokens fit as is
    assert "derived policy.sequence_packing.train_mb_tokens=" in result.line and "of 139.8 GiB" in result.line


def test_activation_checkpointing_keeps_the_shipped_budget_and_cuts_the_peak():
    plain = memory_preflight(_cfg("grpo_math_random_1p7B_fp8_kv.yaml", LONG_8K), shape=SHAPE_1P7B, capacity=H200)
    ckpt_cfg = _cfg("grpo_math_random_1p7B_fp8_kv.yaml", [*LONG_8K, "policy.dtensor_cfg.activation_checkpointing=true"])
    ckpt = memory_preflight(ckpt_cfg, shape=SHAPE_1P7B, capacity=H200)
    # FP8+KV at 8K, eager under auto: captured, it ran out of memory on an H200 (87 GiB of graph pools) where
    # this estimate, counting one reserved micro-batch, had said it fits
    assert plain.derived == {} and not plain.estimate.grads_kept
    assert ckpt.derived == {} and ckpt.peaks["train"] < 0.5 * plain.peaks["train"]  # the shipped budget
    assert ckpt.estimate.train_per_token < 0.25 * plain.estimate.train_per_token
    assert ckpt.estimate.peak("rollout") == plain.estimate.peak("rollout") and "activation_checkpointing on" in ckpt.line
    assert ckpt.peaks["rollout"] == ckpt.estimate.peak("rollout")  # no captured pool
    forced_cfg = _cfg("grpo_math_random_1p7B_fp8_kv.yaml", [*LONG_8K, "policy.dtensor_cfg.activation_checkpointing=true",
                                                            "policy.train_cuda_graphs=true"])  # fmt: skip
    forced = memory_preflight(forced_cfg, shape=SHAPE_1P7B, capacity=H200)
    pool = int(forced.estimate.train_per_token * 4 * 8704)  # the captured micro-batch's activations stay reserved
    assert forced.peaks["rollout"] == forced.estimate.peak("rollout") + pool
    assert forced.peaks["train"] == forced.estimate.peak("train", 4 * 8704) + pool  # a new shape runs eagerly beside it


def test_auto_cuda_graphs_stay_on_at_the_shipped_lengths_and_off_on_a_cpu():
    cuda = memory_preflight(_cfg("grpo_math_random_1p7B_fp8_kv.yaml", []), shape=SHAPE_1P7B, capacity=H200)
    assert cuda.derived == {} and cuda.peaks["rollout"] > cuda.estimate.peak("rollout")  # pool counted
    cpu = memory_preflight(_cfg("grpo_math_random_1p7B_fp8_kv.yaml", []), shape=SHAPE_1P7B)
    assert cpu.derived == {} and cpu.peaks["rollout"] == cpu.estimate.peak("rollout")  # auto: eager on a CPU


@pytest.mark.parametrize(
    "name,overrides,needles",
    [
        ("grpo_math_8B_fp8_kv.yaml", [*LONG_16K, "policy.master_dtype=bfloat16"],
         ["the train phase", "policy.dtensor_cfg.activation_checkpointing=true", "policy.max_total_sequence_length"]),
        ("grpo_math_8B_fp8_kv.yaml", LONG_16K, ["weights, gradients and optimizer state", "policy.master_dtype=bfloat16"]),
        ("grpo_math_random_1p7B_bf16.yaml", [*LONG_8K, "policy.sequence_packing.train_mb_tokens=60000"],
         ["policy.sequence_packing.train_mb_tokens (at most 3", "activation_checkpointing=true"]),
        ("grpo_math_random_1p7B_bf16.yaml", [*LONG_8K, "policy.sequence_packing.enabled=false"],
         ["policy.train_micro_batch_size (at most 3 rows of 8704 tokens fit)"]),
        ("grpo_math_random_1p7B_bf16.yaml", [*LONG_8K, "grpo.num_prompts_per_step=16",
                                             "policy.generation.gpu_memory_utilization=null"],
         ["the rollout phase", "policy.generation.gpu_memory_utilization"]),
    ],
    ids=["8B-16K-no-checkpointing", "8B-fp32-master", "budget-over", "fixed-rows-over", "rollout-kv-over"],
)  # fmt: skip
def test_a_config_that_cannot_fit_is_refused_with_the_keys_to_change(name, overrides, needles):
    shape = SHAPE_8B if "8B" in name else SHAPE_1P7B
    with pytest.raises(MemoryPreflightError) as err:
        memory_preflight(_cfg(name, overrides), shape=shape, capacity=H200)
    message = str(err.value)
    assert "\n" not in message and message.startswith("memory preflight: ")
    for needle in needles:
        assert needle in message


def test_the_8B_shape_at_16K_fits_with_checkpointing_and_bf16_master():
    overrides = [*LONG_16K, "policy.master_dtype=bfloat16", "policy.dtensor_cfg.activation_checkpointing=true"]
    fp8 = memory_preflight(_cfg("grpo_math_8B_fp8_kv.yaml", overrides), shape=SHAPE_8B, capacity=H200)
    bf16 = memory_preflight(_cfg("grpo_math_8B_bf16.yaml", overrides), shape=SHAPE_8B, capacity=H200)
    # the shipped 4 x 16,896-token micro-batches fit, eager (auto does not capture sequences this long)
    assert fp8.derived == bf16.derived == {}
    assert max(fp8.peaks.values()) <= 0.9 * H200 and max(bf16.peaks.values()) <= 0.9 * H200
    assert fp8.peaks["rollout"] < bf16.peaks["rollout"]  # FP8 KV: half the cache


def test_a_cpu_run_reports_without_refusing_and_ray_is_not_estimated():
    cfg = _cfg("grpo_tiny.yaml", ["policy.max_total_sequence_length=4096", "policy.generation.max_new_tokens=4000"])
    result = memory_preflight(cfg)  # tiny-arith's config.json; no CUDA here and no capacity given
    assert "no capacity known (report only)" in result.line and result.derived == {}
    assert result.peaks["train"] > result.estimate.resident_total() > 0
    ray = memory_preflight(_cfg("grpo_tiny.yaml", ["cluster.backend=ray"]))
    assert ray.line.startswith("memory preflight: not estimated") and ray.estimate is None
    off = memory_preflight(_cfg("grpo_tiny.yaml", ["policy.memory_preflight.enabled=false"]))
    assert off.line.startswith("memory preflight: off")


BRIEF_8B = ["policy.master_dtype=bfloat16", "grpo.num_prompts_per_step=8", "grpo.num_generations_per_prompt=8",
            "policy.train_micro_batch_size=4", "policy.logprob_batch_size=8"]  # fmt: skip


def _torchrun(monkeypatch, world: int) -> list[str]:
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", str(world))):
        monkeypatch.setenv(key, value)
    return ["cluster.backend=torchrun", f"cluster.gpus_per_node={world}"]  # the ranks from torchrun's environment


def test_a_torchrun_rank_is_estimated_with_its_shard_and_replica(monkeypatch):
    """The 8B recipes on 2 H200s (the measured DP=2 step-2 OOM): without a per-rank estimate each rank ran the
    shipped 4 x 4,608-token micro-batches where one process derives 12,096 tokens (its bins of ~4.6K-token rows
    held 4 rows instead of 2: about twice the activations). Each rank now derives its own budget: it holds half
    the master state but a whole rollout replica, so its budget lies between the one process's and the default."""
    one = memory_preflight(_cfg("grpo_math_8B_bf16.yaml", [*BRIEF_8B, *_torchrun(monkeypatch, 1)]), shape=SHAPE_8B,
                           capacity=H200)  # fmt: skip
    two = memory_preflight(_cfg("grpo_math_8B_bf16.yaml", [*BRIEF_8B, *_torchrun(monkeypatch, 2)]), shape=SHAPE_8B,
                           capacity=H200)  # fmt: skip
    fp8 = memory_preflight(_cfg("grpo_math_8B_fp8_kv.yaml", [*BRIEF_8B, *_torchrun(monkeypatch, 2)]), shape=SHAPE_8B,
                           capacity=H200)  # fmt: skip
    p, key = SHAPE_8B.params(), "policy.sequence_packing.train_mb_tokens"
    assert one.derived == {key: 12096, "policy.train_cuda_graphs": False}
    assert two.derived == {key: 14080} and fp8.derived == {key: 17216}  # eager on ranks: no graphs key
    assert "per rank of 2 (FSDP2 shard + rollout replica)" in two.line
    res = two.estimate.resident
    assert res["weights"] == p and res["adam"] == 2 * p and res["rollout_replica"] == 2 * p  # BF16: p x 2 / 2 ranks
    root = p - SHAPE_8B.layers * SHAPE_8B.layer_linear_params()  # embeddings, lm_head, norms
    assert res["fsdp_unsharded"] == 2 * root + 2 * 2 * 4096 * 12288  # the root + 2 gate-sized units in flight
    assert res["gradients"] == p + 2 * root + 4 * 2 * 4096 * 12288
    fp8_replica = fp8.estimate.resident["rollout_replica"]
    assert 0.55 < fp8_replica / res["rollout_replica"] < 0.6  # FP8 bits + scales for the linears, BF16 the rest
    assert two.estimate.train_per_token == one.estimate.train_per_token  # a micro-batch keeps what it keeps
    usable = int(0.9 * H200)
    assert two.estimate.peak("train", 14080) <= usable < two.estimate.peak("train", 14080 + 2 * 64)
    assert two.estimate.peak("train", 4 * 4608) > H200  # the default budget: over the whole device (the OOM)


def test_ranks_refuse_what_does_not_fit_and_tensor_parallel_is_not_estimated(monkeypatch):
    overrides = [*LONG_8K, "policy.sequence_packing.train_mb_tokens=60000", *_torchrun(monkeypatch, 2)]
    with pytest.raises(MemoryPreflightError, match="policy.sequence_packing.train_mb_tokens"):
        memory_preflight(_cfg("grpo_math_random_1p7B_bf16.yaml", overrides), shape=SHAPE_1P7B, capacity=H200)
    tp = memory_preflight(_cfg("grpo_math_random_1p7B_bf16.yaml", [*overrides, "policy.dtensor_cfg.tensor_parallel_size=2"]),
                          shape=SHAPE_1P7B, capacity=H200)  # fmt: skip
    assert tp.line == (
        "memory preflight: not estimated for 2 torchrun ranks with policy.dtensor_cfg.tensor_parallel_size 2 "
        "(tensor-parallel activations)"
    )
    assert tp.derived == {} and tp.estimate is None


def test_the_cli_refuses_before_any_work(tmp_path):
    log_dir = tmp_path / "logs"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "run_grpo.py"), "--config", str(CONFIGS / "grpo_tiny.yaml"),
         "policy.memory_preflight.capacity_gib=0.001", f"logger.log_dir={log_dir}", "cluster.device=cpu"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: memory preflight: ") and "Traceback" not in proc.stderr
    assert "policy.master_dtype=bfloat16" in lines[0]
    assert not log_dir.exists()  # nothing ran: no log directory, no model loaded, no rollout


def test_the_logprob_term_is_within_15_percent_of_the_pass_measured_on_an_h200():
    """docs/assets/logprob_memory_8b_16k_h200.json: `benchmarks.logprob_memory` at the 8B shape, 8 x 16,896 packed
    tokens, BF16 recipe with a BF16 master and checkpointing (its allocator trace: gate, up and SiLU*up plus six
    hidden-sized buffers alive at the peak). The estimate before this test counted a training layer's saved
    activations (+35%); before the packed-mask fix the pass itself was ~45 GiB larger."""
    measured = json.loads((ROOT / "docs" / "assets" / "logprob_memory_8b_16k_h200.json").read_text())
    overrides = [f"policy.max_total_sequence_length={measured['seq']}", "cluster.gpus_per_node=1",
                 "policy.master_dtype=bfloat16", "policy.dtensor_cfg.activation_checkpointing=true",
                 "policy.generation.max_new_tokens=16384"]  # fmt: skip
    est = memory_preflight(_cfg("grpo_math_8B_bf16.yaml", overrides), shape=SHAPE_8B, capacity=H200).estimate
    estimated = est.logprob_fixed + est.logprob_per_token * measured["tokens"]
    assert abs(estimated / (measured["pass_peak_gib"] * GIB) - 1) <= 0.15
    h, f = SHAPE_8B.hidden, SHAPE_8B.ffn_intermediate
    assert est.logprob_per_token == 6 * 2 * h + 3 * 2 * f  # what the trace lists, per token


def test_eager_checkpointed_fp8_training_holds_two_layers_of_fp8_weights_not_all():
    """`fp8_cfg.transient_train_weights` (the default; eager FP8 training with checkpointing): the training pass's
    resident state has two layers' FP8 weights, not the whole cache; the rollout and the logprob pass keep it; captured: all kept."""
    overrides = [*LONG_16K, "policy.master_dtype=bfloat16", "policy.dtensor_cfg.activation_checkpointing=true"]
    kept_cfg = _cfg("grpo_math_8B_fp8_kv.yaml", [*overrides, "policy.fp8_cfg.transient_train_weights=false"])
    kept = memory_preflight(kept_cfg, shape=SHAPE_8B, capacity=H200).estimate
    assert kept.train_released == 0  # opted out: the cache held through the step
    eager = memory_preflight(_cfg("grpo_math_8B_fp8_kv.yaml", overrides), shape=SHAPE_8B, capacity=H200).estimate
    layer = int(SHAPE_8B.layer_linear_params() * (1 + 4 / 128**2))
    cache = eager.resident["fp8_weights"]
    assert cache == 36 * layer and eager.train_released == cache - 2 * layer
    assert eager.resident_total("train") == sum(eager.resident.values()) - cache + 2 * layer
    assert eager.resident_total("logprob") == sum(eager.resident.values()) - eager.resident["gradients"]
    captured = memory_preflight(_cfg("grpo_math_8B_fp8_kv.yaml", [*overrides, "policy.train_cuda_graphs=true"]),
                                shape=SHAPE_8B, capacity=None).estimate  # fmt: skip
    assert captured.train_released == 0


@pytest.mark.parametrize("recipe,run", [("bf16", "run1"), ("fp8_kv", "run1"), ("fp8_kv", "run2")])
def test_the_checkpointed_training_peak_is_within_15_percent_of_a_16k_run_on_an_h200(recipe, run):
    """docs/assets/cli_16k_8b_h200_x2_2026-11-30/: `run_grpo.py` with the shipped 8B recipes, 1 prompt x 8 responses
    of up to 16,384 tokens, BF16 master, checkpointing, two packed micro-batches of up to 4 rows a step. Step 2's
    training peak (AdamW's state in; the second micro-batch's backward starts with every gradient alive) against
    the estimate at the largest micro-batch (run 1's FP8+KV step had a shorter second one). The backward's working
    set counted as one more layer's activations (before this test) put that step at +16%; the trace has the
    recomputed layer's gate / up gradients there."""
    rows = [json.loads(line) for line in (ROOT / "docs" / "assets" / "cli_16k_8b_h200_x2_2026-11-30" / run
                                          / f"{recipe}_16k" / "metrics.jsonl").read_text().splitlines()]  # fmt: skip
    step2 = {k: v for row in rows if row.get("step") == 2 for k, v in row.items()}
    tokens = 4 * int(step2["train/mean_prompt_length"] + step2["train/max_gen_tokens_per_sample"])  # a full bin
    overrides = [*LONG_16K, "grpo.num_prompts_per_step=1", "policy.master_dtype=bfloat16",
                 "policy.dtensor_cfg.activation_checkpointing=true"]  # fmt: skip
    est = memory_preflight(_cfg(f"grpo_math_8B_{recipe}.yaml", overrides), shape=SHAPE_8B, capacity=H200).estimate
    assert abs(est.peak("train", tokens) / (step2["memory/training_peak_gib"] * GIB) - 1) <= 0.15
    h, f = SHAPE_8B.hidden, SHAPE_8B.intermediate  # per token: 36 layer inputs, the recomputed layer's activations,
    # its gate / up gradients, the final norm's input and output
    assert est.train_per_token == 36 * 2 * h + est.layer_bytes + 2 * 2 * f + 4 * h
