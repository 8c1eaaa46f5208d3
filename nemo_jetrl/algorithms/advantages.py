"""GRPO group advantages (NeMo-RL semantics).

Rewards arrive flat, `[N*G]`, with the G samples of one prompt adjacent (prompt-major). Per group:

- baseline: the group mean, or with `leave_one_out` the mean of the *other* G-1 samples (RLOO);
- std: the unbiased (Bessel, ``correction=1``) std of the same samples the baseline averages, so with
  `leave_one_out` each sample gets the std of the other G-1 rewards (NeMo-RL's
  ``calculate_baseline_and_std_per_prompt``); fewer than two samples give std 0;
- advantage = reward - baseline, divided by ``std + eps`` only where std > 0 (NeMo-RL's
  ``normalize_advantages_with_epsilon``: samples without variation are not sharpened).

Groups whose rewards are all equal get exactly 0 advantage (no rounding residue from the mean), and
`zero_std_groups` marks them so the loop can drop them.
"""

from __future__ import annotations

import torch


def _grouped(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Check and reshape flat rewards to `[N, G]` (float32 or wider)."""
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive int, got {group_size!r}")
    if not isinstance(rewards, torch.Tensor) or rewards.dim() != 1:
        shape = tuple(rewards.shape) if isinstance(rewards, torch.Tensor) else type(rewards).__name__
        raise ValueError(f"rewards must be a 1-D tensor [N*G], got {shape}")
    if rewards.numel() % group_size != 0:
        raise ValueError(f"rewards has {rewards.numel()} entries, not a multiple of group_size={group_size}")
    dtype = torch.promote_types(rewards.dtype, torch.float32) if rewards.is_floating_point() else torch.float32
    r = rewards.to(dtype)
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf")
    return r.view(-1, group_size)  # [N, G]


def _constant_rows(x: torch.Tensor) -> torch.Tensor:
    """True where every entry of the last dim is equal. x: [..., K] -> [...]."""
    return x.amax(-1) == x.amin(-1)


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    leave_one_out: bool = False,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Group-relative advantages. rewards: [N*G] -> advantages [N*G] (float32, or the rewards' wider dtype)."""
    if eps < 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = _grouped(rewards, group_size)  # [N, G]
    n, g = r.shape
    if g == 1:
        # NeMo-RL: a prompt with <= 1 valid sample gets baseline = reward, i.e. no signal.
        return torch.zeros_like(r).view(-1)

    if leave_one_out:
        # others[:, i] = the rewards of the group without sample i.
        idx = torch.tensor([[j for j in range(g) if j != i] for i in range(g)], device=r.device)  # [G, G-1]
        others = r[:, idx]  # [N, G, G-1]
        baseline = others.mean(-1)  # [N, G]
        if g > 2:
            std = others.std(-1, correction=1)  # [N, G]
            std = torch.where(_constant_rows(others), torch.zeros_like(std), std)
        else:
            std = torch.zeros_like(r)  # one other sample: no spread to estimate
    else:
        baseline = r.mean(-1, keepdim=True).expand(n, g)  # [N, G]
        std = r.std(-1, correction=1, keepdim=True).expand(n, g)  # [N, G]

    adv = r - baseline  # [N, G]
    if normalize_std:
        adv = torch.where(std > 0, adv / (std + eps), adv)
    # All-equal groups: exactly zero (the mean of equal floats can miss them by an ulp).
    adv = torch.where(_constant_rows(r).unsqueeze(-1), torch.zeros_like(adv), adv)
    return adv.reshape(-1)


def zero_std_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """Bool mask [N*G]: True for every sample of a group whose rewards are all equal (no learning signal)."""
    r = _grouped(rewards, group_size)  # [N, G]
    return _constant_rows(r).unsqueeze(-1).expand_as(r).reshape(-1)


def reward_metrics(rewards: torch.Tensor, group_size: int) -> dict[str, float]:
    """Batch reward statistics: mean, population std, mean of per-group best (pass@G for 0/1 rewards),
    and the fraction of groups with all-equal rewards."""
    r = _grouped(rewards, group_size)  # [N, G]
    return {
        "reward_mean": float(r.mean()),
        "reward_std": float(r.std(correction=0)),
        "reward_group_best_mean": float(r.amax(-1).mean()),
        "zero_std_group_fraction": float(_constant_rows(r).float().mean()),
    }
