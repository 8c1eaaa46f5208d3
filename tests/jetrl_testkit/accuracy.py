"""Helpers of the accuracy studies' tests: arm configs compared key by key, corruptions of a worked solution."""

from __future__ import annotations

# the keys in which the accuracy studies' arm overlays may differ (precision, IS correction, kernel switches)
ARM_KEYS = {
    ("policy", "precision"), ("policy", "generation", "precision"), ("policy", "generation", "kv_cache_dtype"),
    ("policy", "fp8_cfg", "train_kv_fake_quant"), ("policy", "generation", "matched_kernels"),
    ("policy", "generation", "deterministic"), ("loss_fn", "use_importance_sampling_correction"),
    ("loss_fn", "truncated_importance_sampling_type"), ("loss_fn", "truncated_importance_sampling_ratio"),
    ("loss_fn", "truncated_importance_sampling_ratio_min"),
}  # fmt: skip


def flat(d: dict, prefix: tuple = ()) -> dict[tuple, object]:
    """{(section, ..., key): value} of a nested dict."""
    out = {}
    for k, v in d.items():
        out.update(flat(v, (*prefix, k)) if isinstance(v, dict) else {(*prefix, k): v})
    return out


def outside_arm_keys(config: dict) -> dict[tuple, object]:
    """A config's keys and values, without the ones arms may differ in."""
    return {k: v for k, v in flat(config).items() if k not in ARM_KEYS}


def answer_corruptions(solution: str) -> list[str]:
    """Worked solutions whose final answer (after the last `#`) is wrong or missing."""
    return [
        solution[:-1] + str((int(solution[-1]) + 1) % 10),  # wrong last digit
        solution.replace("#", ";"),  # no final answer
        solution[:-1],  # a digit short
        solution + "0",  # a digit too many
        solution.replace("#", "#0"),  # leading zero
        solution + "#",  # a later, empty final answer
    ]
