"""The one-GPU trainer's features on 2 torchrun ranks (gloo, CPU) == one process, through the CLI.

Each case runs `examples/run_grpo.py` (its `main`, as `torchrun --nproc-per-node 2 examples/run_grpo.py ...` runs
it: RANK / WORLD_SIZE / LOCAL_RANK set, `cluster.backend` null detected as torchrun) on 2 CPU ranks forked from one
interpreter that imported torch once (jetrl_testkit/forkrun.py), for 2 GRPO steps of the tiny FP8 config, and
`run_grpo` of the same config in this process with the ranks' rollout seed shards (`cluster.rollout_seed_shards=2`).
The Ray twin of the same cases is tests/functional/test_ray_workers.py (one process == 2 Ray workers).

Bounds, per case (docs/cluster.md, "Same results on 1 process and on W ranks"):
- one training micro-batch per rank (`fixed`, `post_step`, `bf16`): every logged metric bitwise, both steps (the
  gradient is the same sum of two micro-batch gradients; its norm is summed in float64 and rounded once);
- several micro-batches per rank (`packed`; dynamic batching cuts the same way, test_ray_workers.py runs it): the
  gradient is reduce-scattered after each micro-batch,
  so rank 0's second micro-batch is added after rank 1's first; the master weights after a step are an ulp apart
  and an FP8 tile may round the other way at step 2: rollout metrics equal, the rest 1e-5 relative (as Ray).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jetrl_testkit.forkrun import run_launches
from jetrl_testkit.runs import TINY_TWO_STEPS
from jetrl_testkit.runs import metrics as _metrics

from nemo_jetrl.algorithms.grpo import run_grpo
from nemo_jetrl.config import load_config
from nemo_jetrl.schema import validate_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
EXACT = ("reward_mean", "accuracy", "mean_response_length", "truncated_fraction", "kept_fraction")
COMMON = TINY_TWO_STEPS  # one 16-row micro-batch per rank
# case -> (config, overrides, bitwise); grpo_tiny: unified FP8, FP8 KV cache calibrated in the step's
# prev_logprobs forward (fused), K/V fake-quantized in the trainer, prev_logprobs from the training forward
CASES = {
    "fixed": ("grpo_tiny.yaml", ["policy.generation.matched_kernels=true", "loss_fn.reference_policy_kl_penalty=0.05"], True),
    "post_step": ("grpo_tiny.yaml", ["policy.prev_logprobs_source=logprob_forward",
                                     "policy.generation.kv_cache_calibration_pass=post_step",
                                     "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8"], True),
    "bf16": ("grpo_tiny_bf16.yaml", [], True),
    "packed": ("grpo_tiny.yaml", ["policy.sequence_packing.enabled=true", "policy.sequence_packing.train_mb_tokens=60",
                                  "policy.sequence_packing.sequence_length_round=4"], False),
}  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict, dict]]:
    """case -> (one process's metrics, the 2 ranks' metrics); the ranks' launches run first, one after another."""
    tmp = tmp_path_factory.mktemp("matrix")
    launches = []
    for name, (config, extra, _) in CASES.items():
        args = ["--config", str(CONFIGS / config), *COMMON, *extra, f"logger.log_dir={tmp / name / 'ranks'}"]
        launches.append((ROOT / "examples" / "run_grpo.py", 2, args))
    proc = run_launches(launches, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.count("cluster: torchrun, 2 rank(s)") == len(CASES)  # rank 0 says it, rank 1 is silent
    out = {}
    for name, (config, extra, _) in CASES.items():
        local = [*COMMON, *extra, "cluster.rollout_seed_shards=2", f"logger.log_dir={tmp / name / 'local'}"]
        run_grpo(validate_config(load_config(CONFIGS / config, local)))
        out[name] = (_metrics(tmp / name / "local"), _metrics(tmp / name / "ranks"))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_two_torchrun_ranks_equal_one_process(runs, case):
    local, ranks = runs[case]
    bitwise = CASES[case][2]
    assert sorted(local) == sorted(ranks) == [1, 2]
    for step in (1, 2):
        refit = {k for k in ranks[step] if k.startswith("train/refit/") and k not in local[step]}
        # rank 0 also splits its own rollout (one seed shard, one engine call) and times the gather of the others'
        parts = {k for k in ranks[step] if k.startswith("timing/generation/") and k not in local[step]}
        assert "timing/generation/rank_gather" in parts and "timing/generation/decode" in parts
        assert 0.0 <= ranks[step]["timing/generation/rank_gather"] <= ranks[step]["timing/generation"]
        assert {k for k in ranks[step] if k not in refit | parts} == set(local[step])  # the same metrics, plus these
        for key, value in local[step].items():
            if key.startswith("timing/") or key.endswith("_s") or key == "step":
                continue
            if bitwise or key.removeprefix("train/") in EXACT:
                assert ranks[step][key] == value, (case, step, key)
            else:
                assert ranks[step][key] == pytest.approx(value, rel=1e-5, abs=1e-7), (case, step, key)
        fp8 = ranks[step].get("train/refit/num_fp8_weights", 0)
        assert fp8 == (0 if case == "bf16" else 28)
        if fp8:  # one refit an optimizer step: FP8 bits + scales, the rest in FP32
            assert ranks[step]["train/refit/fp8_vs_bf16_bytes"] == 0.5 + 4 / (2 * 128 * 128)
            gathered = ranks[step]["train/refit/allgather_bytes"] - ranks[step]["train/refit/fsdp_allgather_bytes"]
            refits = ranks[step].get("train/num_optimizer_steps", 0)
            per_refit = ranks[step]["train/refit/fp8_weight_bytes"] + ranks[step]["train/refit/other_bytes"]
            assert gathered == refits * per_refit, (case, step)


def test_the_tiny_fp8_step_gathers_less_than_half_the_bf16_steps_bytes(runs):
    """Bytes every rank assembles per step (FSDP2's all-gathers in the forwards + the refit): the FP8 run gathers
    the linears' FP8 bits once; the BF16 run all-gathers their FP32 masters in every forward and backward."""
    fp8, bf16 = runs["fixed"][1][2], runs["bf16"][1][2]
    ratio = fp8["train/refit/allgather_bytes"] / bf16["train/refit/allgather_bytes"]
    assert ratio < 0.2, ratio
