"""vLLM's sleep / wake-up around the training phase (CUDA): the order of vLLM calls the adapter makes.

vLLM's CPU backend has no sleep mode, so this drives the adapter's logic against a recording stand-in for `vllm.LLM`
(no vLLM needed); the real engine's refit and KV scales are covered in tests/functional/test_vllm_backend.py.
"""

from __future__ import annotations

import pytest
import torch

from nemo_jetrl.generation.interfaces import rollout_phase
from nemo_jetrl.generation.vllm_engine import VllmGenerationEngine, vllm_missing_reason


class RecordingLLM:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self, level: int) -> None:
        self.calls.append(f"sleep({level})")

    def wake_up(self) -> None:
        self.calls.append("wake_up")

    def collective_rpc(self, method, args=(), kwargs=None):
        if method == "reload_weights":
            self.calls.append(f"reload({','.join(name for name, _ in kwargs['weights_iterator'])})")
            return [None]
        fn = args[0]  # _on_model(fn, *args): the adapter's KV-scale writer
        self.calls.append(f"rpc({fn.__name__},{float(args[1][0])})")
        return [None]


def _engine(sleep_level: int, version: list[int]) -> VllmGenerationEngine:
    """The adapter's refit / sleep state around a recording LLM (its vLLM start-up is what this skips)."""
    engine = VllmGenerationEngine.__new__(VllmGenerationEngine)
    engine.llm = RecordingLLM()
    engine.sleep_level, engine._asleep, engine._pending_weights = sleep_level, False, None
    engine._kv_scales, engine.num_refits = None, 0
    engine._weights_version = lambda: version[0]
    engine._loaded_version = version[0]
    engine.rollout_state = lambda: {f"w@{version[0]}": torch.zeros(1)}
    return engine


def _kv(value: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2,), value), torch.full((2,), value)


def test_level_two_sleeps_through_training_and_reloads_on_wake():
    version = [0]
    engine = _engine(2, version)
    with rollout_phase(engine):  # step 1's rollout: awake, nothing to load
        pass
    assert engine.llm.calls == ["sleep(2)"]
    version[0] = 1  # the optimizer step
    engine.update_weights(kv_scales=_kv(0.5))  # the refit arrives while vLLM sleeps: held back
    assert engine.llm.calls == ["sleep(2)"] and engine.kv_scales[0][0].item() == 0.5
    with rollout_phase(engine):
        pass
    # wake, the new weights (their version), then the KV scales on top of them, asleep again
    assert engine.llm.calls == ["sleep(2)", "wake_up", "reload(w@1)", "rpc(_set_kv_scales,0.5)", "sleep(2)"]
    # no optimizer step in between: level 2 discarded the weights, so the wake-up reloads them all the same
    engine.prepare_for_generation()
    assert engine.llm.calls[-3:] == ["wake_up", "reload(w@1)", "rpc(_set_kv_scales,0.5)"]
    assert engine.num_refits == 2


def test_level_one_keeps_the_weights_and_reloads_only_a_new_version():
    version = [0]
    engine = _engine(1, version)
    engine.finish_generation()
    engine.prepare_for_generation()
    assert engine.llm.calls == ["sleep(1)", "wake_up"]  # weights offloaded and restored by vLLM, none reloaded
    engine.finish_generation()
    version[0] = 1
    engine.update_weights()
    engine.prepare_for_generation()
    assert engine.llm.calls[-2:] == ["wake_up", "reload(w@1)"]


def test_without_sleep_mode_the_phase_calls_do_nothing_and_refits_load_at_once():
    version = [0]
    engine = _engine(0, version)
    with rollout_phase(engine):
        pass
    version[0] = 1
    engine.update_weights(kv_scales=_kv(2.0))
    assert engine.llm.calls == ["reload(w@1)", "rpc(_set_kv_scales,2.0)"]


def test_sleep_mode_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: sleep levels are valid here")
    if vllm_missing_reason() is not None:
        pytest.skip(vllm_missing_reason())
    with pytest.raises(ValueError, match="needs CUDA"):
        VllmGenerationEngine.__init__(
            VllmGenerationEngine.__new__(VllmGenerationEngine), None, None, None, max_new_tokens=1,
            max_total_length=2, temperature=1.0, top_p=1.0, top_k=None, stop_token_ids=[0], pad_token_id=0,
            compute_dtype=torch.float32, kv_cache_dtype=None, enforce_eager=True, seed=0,
            weights_version=lambda: 0, sleep_level=2,
        )  # fmt: skip


def test_cpu_fp8_kv_cache_needs_avx512_or_amx(tmp_path):
    from nemo_jetrl.generation.vllm_engine import cpu_fp8_kv_missing_reason

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    assert "needs x86 AVX-512 or AMX" in cpu_fp8_kv_missing_reason(str(info))
    info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f\n")
    assert cpu_fp8_kv_missing_reason(str(info)) is None
    info.write_text("flags\t\t: avx2 amx_tile amx_bf16\n")
    assert cpu_fp8_kv_missing_reason(str(info)) is None
    assert cpu_fp8_kv_missing_reason(str(tmp_path / "absent")) is None  # unreadable: vLLM's own error stands


@pytest.mark.parametrize("use_deep_gemm", [False, True])
def test_vllm_environment_follows_the_recipe(use_deep_gemm):
    from nemo_jetrl.generation.vllm_engine import vllm_environment
    from nemo_jetrl.precision import PrecisionRecipe

    recipe = PrecisionRecipe.preset("jetrl", use_deep_gemm=use_deep_gemm)
    cuda = vllm_environment(recipe, on_cpu=False, kv_bytes=None)
    assert cuda == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_DEEP_GEMM": "1" if use_deep_gemm else "0"}
    cpu = vllm_environment(recipe, on_cpu=True, kv_bytes=3 * (1 << 30) + 1)
    assert cpu == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_KVCACHE_SPACE": "4"}  # GiB, rounded up
