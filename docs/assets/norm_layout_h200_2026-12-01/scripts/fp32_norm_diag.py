"""GPU diagnostic for the FP32 fused norm + FP8 cast mismatch (docs/mismatch.md, "Attempt, not landed: the fused
cast over FP32 activations"). The small Qwen3 FP32-master exact-mode setup of
tests/gpu/test_grpo_gpu.py::test_small_qwen3_exact_mode_fp8_kv_is_exact_at_another_micro_batch, rolled out eagerly:

  (a) the shipped rollout (FP32 activations: plain norm, the linears cast);
  (b) the fused norm + FP8 cast forced on over FP32 activations (`decoder.exact_squares` -> True), every fused call
      checked against the plain norm + act_quant on the same inputs (bytes of e4m3 data, scales, residual);

then tokens / logprobs of (b) against (a), and the trainer's logprobs against each. --squares mulrn also rounds the
norm's squares on their own (`_mul_rn`) in the glue norm kernel (both variants, as the 2026-12-01 attempt did).
Writes $OUT/fp32_norm_diag.json and, at the first mismatching fused call, $OUT/bad_case.pt (its inputs).

    PYTHONPATH=/tmp/site:$PWD python3 .gpu/fp32_norm_diag.py --squares plain|mulrn
"""

import argparse
import json
import os
import pathlib
import sys

import torch

sys.path.insert(0, "tests/gpu")
sys.path.insert(0, ".gpu")
import test_grpo_gpu as G  # noqa: E402
from transformers import Qwen3Config, Qwen3ForCausalLM  # noqa: E402

from nemo_jetrl.models import decoder, fused_ops  # noqa: E402
from nemo_jetrl.policy.interfaces import TrainBatch  # noqa: E402
from nemo_jetrl.precision import PrecisionRecipe, act_quant  # noqa: E402

OUT = os.environ.get("OUT", ".")
p = argparse.ArgumentParser()
p.add_argument("--squares", choices=["plain", "mulrn"], default="plain")
args = p.parse_args()

if args.squares == "mulrn":  # a patched copy of the glue module's norm kernel, swapped in for both variants
    src = pathlib.Path("nemo_jetrl/models/fused_ops.py").read_text()
    old = "    rstd = tl.math.rsqrt(tl.sum(x * x, axis=0) / N + eps)\n"
    assert src.count(old) == 1
    src = src.replace(old, "    rstd = tl.math.rsqrt(tl.sum(_mul_rn(x, x, HW), axis=0) / N + eps)\n")
    pathlib.Path(".gpu/fused_ops_mulrn.py").write_text(src)
    import fused_ops_mulrn

    fused_ops._add_rms_norm_kernel = fused_ops_mulrn._add_rms_norm_kernel

DEV = torch.device("cuda")
torch.manual_seed(0)
cfg = Qwen3Config(**G.SMALL_QWEN3)
cfg._attn_implementation = "sdpa"
with torch.device(DEV):
    model = Qwen3ForCausalLM(cfg).float()
prompts = torch.randint(1, G.SMALL_QWEN3["vocab_size"], (32, 48), generator=torch.Generator().manual_seed(0)).tolist()
policy, engine = G.parts(model, None, PrecisionRecipe.preset("jetrl_kv"), mbs=8, max_new_tokens=32, deterministic=True)
eager = engine.replace(cuda_graphs=False)
G.bootstrap_kv(policy, eager, prompts)

calls, bad = [], []
fused_fp8 = fused_ops.add_rms_norm_fp8


def checked(x, delta, weight, eps, block, pow2):
    res, q, s = fused_fp8(x, delta, weight, eps, block, pow2)
    res2, h = fused_ops.add_rms_norm(x, delta, weight, eps)
    h2 = h.reshape(-1, h.shape[-1])
    q2, s2 = act_quant(h2, block, pow2)
    q_diff = (q.view(torch.uint8) != q2.view(torch.uint8)).sum().item()
    s_diff = (s.float() != s2.float()).sum().item()
    rec = {
        "x": str(x.dtype),
        "delta": str(delta.dtype) if delta is not None else None,
        "w": str(weight.dtype),
        "shape": list(x.shape),
        "strides": list(x.stride()),
        "h": str(h.dtype),
        "q_diff": q_diff,
        "s_diff": s_diff,
        "res_same": bool(torch.equal(res, res2)),
        "autocast": torch.is_autocast_enabled("cuda"),
    }
    calls.append(rec)
    if (q_diff or s_diff or not rec["res_same"]) and not bad:
        rows = ((q.view(torch.uint8) != q2.view(torch.uint8)).any(-1) | (s.float() != s2.float()).any(-1)).nonzero()
        bad.append(rec)
        torch.save(
            {
                "x": x.detach().cpu(),
                "delta": None if delta is None else delta.detach().cpu(),
                "weight": weight.detach().cpu(),
                "eps": eps,
                "block": block,
                "pow2": pow2,
                "rows": rows.flatten().cpu(),
            },
            f"{OUT}/bad_case.pt",
        )
    return res, q, s


def rollout(seed: int):
    return eager.generate(prompts, generator=torch.Generator(DEV).manual_seed(seed))


def trainer_exact(out) -> float:
    batch = TrainBatch(out.input_ids.cpu(), out.attention_mask.cpu(), out.response_mask.cpu(), torch.zeros(len(out)),
                       out.generation_logprobs.float().cpu())  # fmt: skip
    lp = policy.get_logprobs(batch)
    m = batch.response_mask.bool()
    return float((lp[m] == batch.generation_logprobs[m]).float().mean())


report = {"squares": args.squares, "device": torch.cuda.get_device_name()}
plain_out = rollout(0)
report["shipped: trainer exact fraction"] = trainer_exact(plain_out)
decoder.exact_squares = lambda dtype: True
fused_ops.add_rms_norm_fp8 = checked
fused_out = rollout(0)
fused_ops.add_rms_norm_fp8 = fused_fp8
m = plain_out.response_mask.bool()
report["fused: tokens equal the shipped rollout's"] = bool(torch.equal(fused_out.input_ids, plain_out.input_ids))
report["fused: logprobs equal the shipped rollout's (fraction)"] = float(
    (fused_out.generation_logprobs.float()[m] == plain_out.generation_logprobs.float()[m]).float().mean()
)
report["fused: trainer exact fraction"] = trainer_exact(fused_out)
report["fused calls"] = len(calls)
report["fused calls with any difference"] = sum(bool(c["q_diff"] or c["s_diff"] or not c["res_same"]) for c in calls)
report["first differing call"] = bad[0] if bad else None
report["call kinds"] = sorted({json.dumps({k: c[k] for k in ("x", "delta", "w", "h", "autocast")}) for c in calls})
print(json.dumps(report, indent=1))
json.dump({"report": report, "calls": calls}, open(f"{OUT}/fp32_norm_diag_{args.squares}.json", "w"), indent=1)
