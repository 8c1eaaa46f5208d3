"""NEMO_JETRL_PROFILE: which phases of which step are profiled, what the file holds, kernel families."""

import gzip
import json
from types import SimpleNamespace

import pytest
import torch

from nemo_jetrl.utils.phase_profile import ENV, TRACE_ENV, ProfileRequest, family_totals, kernel_family, kernel_rows
from nemo_jetrl.utils.timers import Timer


def test_request_parses_phases_and_step(tmp_path):
    req = ProfileRequest.from_env(tmp_path, {ENV: " training, logprobs @3"})
    assert req.phases == {"training", "logprobs"} and req.step == 3 and req.out_dir == tmp_path / "profile"
    assert not req.trace and ProfileRequest.from_env(tmp_path, {ENV: "training@1", TRACE_ENV: "1"}).trace
    assert req.for_step(2) is None and req.for_step(3) is not None
    assert ProfileRequest.from_env(tmp_path, {}) is None and ProfileRequest.from_env(tmp_path, {ENV: " "}) is None


@pytest.mark.parametrize("spec", ["training", "training@", "@3", "training@0", "training@x", ",@2"])
def test_malformed_request_is_refused_with_the_form(tmp_path, spec):
    with pytest.raises(ValueError, match=r'expected "phase\[,phase...\]@step"'):
        ProfileRequest.from_env(tmp_path, {ENV: spec})


def test_only_the_requested_phases_of_the_step_are_profiled(tmp_path):
    req = ProfileRequest.from_env(tmp_path, {ENV: "training@1", TRACE_ENV: "1"})
    timer = Timer(profile=req.for_step(1))
    with timer.time("total_step_time"):
        with timer.time("generation"):
            torch.ones(4).sum()
        with timer.time("training"):
            (torch.randn(64, 64) @ torch.randn(64, 64)).sum()
    files = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert files == ["step1_training.json", "step1_training.trace.json.gz"]
    record = json.loads((tmp_path / "profile" / files[0]).read_text())
    assert record["phase"] == "training" and record["step"] == 1 and record["device"] == "cpu"
    assert record["wall_ms"] == pytest.approx(timer.durations("training")[0] * 1e3)  # the phase's timed interval
    assert record["rows"] == [] and record["kernels_ms"] == 0  # a CPU run launches no CUDA kernel
    assert "aten::mm" in {row["name"] for row in record["host_rows"]}  # the host side: the matmul ran there
    with gzip.open(tmp_path / "profile" / files[1], "rt") as f:
        assert any(e.get("name") == "aten::mm" for e in json.load(f)["traceEvents"])


def test_kernel_families_sum_the_rows():
    names = {
        "flash_fwd_kernel": "attention",
        "_fp8_gemm_kernel": "fp8 gemm",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTN": "bf16 gemm",
        "_act_quant_groups_kernel": "quantize",
        "_add_rms_norm_fp8_kernel": "glue",
        "multi_tensor_apply_kernel": "optimizer",
        "void at::native::elementwise_kernel<direct_copy>": "copy/cat",
        "something_else": "other",
    }
    assert {n: kernel_family(n) for n in names} == names
    rows = [{"name": "flash_fwd_kernel", "ms": 2.0}, {"name": "flash_bwd_kernel", "ms": 3.0}, {"name": "x", "ms": 1.5}]
    assert family_totals(rows) == {"attention": 5.0, "other": 1.5}


def test_kernel_rows_keep_lambda_named_kernels_and_drop_annotations():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(key, us, device=cuda, count=2, annotation=False):
        return SimpleNamespace(key=key, self_device_time_total=us, device_type=device, count=count,
                               is_user_annotation=annotation)  # fmt: skip

    events = [
        event("gemm", 3000.0),
        event("elementwise_kernel<direct_copy_kernel_cuda(...)::{lambda()#3}>", 1000.0),  # a kernel, '#' and all
        event("ProfilerStep#3", 4000.0),  # annotations span kernels: counting them would count twice
        event("## training ##", 4000.0, annotation=True),
        event("aten::mm", 0.0, device=cpu),
    ]
    rows = kernel_rows(events, divide=2)
    assert rows == [
        {"name": "gemm", "ms": 1.5, "calls": 1.0},
        {"name": "elementwise_kernel<direct_copy_kernel_cuda(...)::{lambda()#3}>", "ms": 0.5, "calls": 1.0},
    ]
