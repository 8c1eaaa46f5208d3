"""`fma32(a, b, c)`: the correctly rounded float32 fused multiply-add, in numpy (no hardware FMA needed).

The product of two float32 values is exact in float64; TwoSum gives the float64 sum and its exact error; a float64
sum lying exactly halfway between two float32 values is then moved to the side the error points to (rounding twice
would otherwise pick the even neighbour). Used to check the quantizer's division by a reciprocal on the CPU, and by
Triton's interpreter, whose own fma is a*b + c rounded twice."""

from __future__ import annotations

import numpy as np


def fma32(a, b, c) -> np.ndarray:
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b  # exact
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)  # s + err == p + c exactly (TwoSum)
    with np.errstate(over="ignore", invalid="ignore"):
        f = s.astype(np.float32)
        d = s - f.astype(np.float64)  # how far float32 rounding moved s (exact)
        other = np.nextafter(f, np.where(d > 0, np.float32(np.inf), np.float32(-np.inf)))
        halfway = (d != 0) & (2 * np.abs(d) == np.abs(other.astype(np.float64) - f.astype(np.float64)))
        fix = halfway & np.isfinite(err) & (err != 0) & (np.sign(err) == np.sign(d))
    return np.where(fix, other, f).astype(np.float32)
