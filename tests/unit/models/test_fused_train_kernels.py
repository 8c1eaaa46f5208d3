"""The trainer's differentiable glue kernels (`fused_train_ops`) on CPU through Triton's interpreter (child
process: TRITON_INTERPRET is read when kernels are defined): forward bitwise the eager HF math, gradients no
further from an FP64 autograd reference than eager bf16 autograd is; the trainer's fast path through
`sequence_logprobs` (fused glue, left-aligned rows with causal attention) vs the eager path. Plus the row alignment (in-process)."""

import textwrap

import pytest
import torch

from nemo_jetrl.models.decoder import _right_padded
from nemo_jetrl.models.scoring import left_align_index

pytest.importorskip("triton")

CHILD = textwrap.dedent(
    """
    import json, torch
    from nemo_jetrl.models import fused_ops as F, fused_train_ops as T
    from nemo_jetrl.models.scoring import sequence_logprobs
    from nemo_jetrl.models.tiny import random_tiny_qwen3
    from nemo_jetrl.precision import PrecisionRecipe, convert_to_fp8

    def rel(a, b):
        return float((a.double() - b.double()).norm() / b.double().norm())

    def run(fn, inputs, grads_out):
        ins = [t.detach().clone().requires_grad_() for t in inputs]
        outs = fn(*ins)
        outs = outs if isinstance(outs, tuple) else (outs,)
        torch.autograd.backward(outs, grads_out)
        return outs, [t.grad for t in ins]

    def compare(name, fused, ref, inputs, grads_out):
        (o1, g1), (o2, g2) = run(fused, inputs, grads_out), run(ref, inputs, grads_out)
        _, g3 = run(ref, [t.double() for t in inputs], [g.double() for g in grads_out])
        r[name + "_fwd_equal"] = all(torch.equal(a, b) for a, b in zip(o1, o2))
        r[name + "_grad_err"] = [rel(a, c) for a, c in zip(g1, g3)]  # fused vs fp64
        r[name + "_eager_err"] = [rel(b, c) for b, c in zip(g2, g3)]  # eager bf16 vs fp64

    torch.manual_seed(0)
    r = {}
    bf = torch.bfloat16
    x, d, gr, go = (torch.randn(37, 256).to(bf) for _ in range(4))
    w = (1 + 0.1 * torch.randn(256)).to(bf)
    compare("add_norm", lambda a, b, c: T.add_rms_norm(a, b, c, 1e-6),
            lambda a, b, c: F.add_rms_norm_ref(a, b, c, 1e-6), [x, d, w], [gr, go])
    compare("norm", lambda a, c: T.add_rms_norm(a, None, c, 1e-6)[1],
            lambda a, c: F.rms_norm_ref(a, c, 1e-6), [x, w], [go])
    # a checkpointed layer's input: the residual sum made first, then the norm of it with its residual output used:
    # the fused add + norm's outputs and gradients, to the bit
    (o1, g1), (o2, g2) = (run(lambda a, b, c: T.add_rms_norm(a, b, c, 1e-6), [x, d, w], [gr, go]),
                          run(lambda a, b, c: T.add_rms_norm(a + b, None, c, 1e-6), [x, d, w], [gr, go]))
    r["residual_sum_bitwise"] = [torch.equal(a, b) for a, b in zip((*o1, *g1), (*o2, *g2))]
    q, gq = torch.randn(2, 5, 3, 32).to(bf), torch.randn(2, 5, 3, 32).to(bf)
    wn, cos, sin = (1 + 0.1 * torch.randn(32)).to(bf), torch.randn(2, 5, 32).to(bf), torch.randn(2, 5, 32).to(bf)
    compare("qk_norm_rope", lambda a, c: T.qk_norm_rope(a, c, 1e-6, cos, sin),
            lambda a, c: F.qk_norm_rope_ref(a, c, 1e-6, cos.double() if a.dtype == torch.float64 else cos,
                                             sin.double() if a.dtype == torch.float64 else sin), [q, wn], [gq])
    compare("rope", lambda a: T.qk_norm_rope(a, None, 0.0, cos, sin),
            lambda a: F.qk_norm_rope_ref(a, None, 0.0, cos.to(a.dtype), sin.to(a.dtype)), [q], [gq])
    # the gradient as SDPA hands it back: a transposed (non-contiguous) view
    compare("rope_t", lambda a, c: T.qk_norm_rope(a, c, 1e-6, cos, sin).transpose(1, 2),
            lambda a, c: F.qk_norm_rope_ref(a, c, 1e-6, cos.to(a.dtype), sin.to(a.dtype)).transpose(1, 2),
            [q, wn], [gq.transpose(1, 2)])
    # q as a column view of a wider buffer (the grouped q/k/v GEMM's output): the same bits as a compact q, and the
    # buffer (the other projections' columns) is not kept alive to the backward
    import gc, weakref

    def as_columns(a, c):
        wide = torch.cat([a.flatten(2), torch.zeros(2, 5, 64, dtype=a.dtype)], -1)  # [2, 5, 3 * 32 + 64]
        return T.qk_norm_rope(wide[..., :96].view(2, 5, 3, 32), c, 1e-6, cos, sin)

    (o1, g1), (o2, g2) = (run(as_columns, [q, wn], [gq]),
                          run(lambda a, c: T.qk_norm_rope(a, c, 1e-6, cos, sin), [q, wn], [gq]))
    r["qk_columns_bitwise"] = [torch.equal(a, b) for a, b in zip((*o1, *g1), (*o2, *g2))]
    leaf = q.detach().clone().requires_grad_()
    wide = torch.cat([leaf.flatten(2), torch.zeros(2, 5, 64, dtype=bf)], -1)
    out = T.qk_norm_rope(wide[..., :96].view(2, 5, 3, 32), wn, 1e-6, cos, sin)
    ref = weakref.ref(wide)
    del wide
    gc.collect()
    r["qk_columns_buffer_freed"] = ref() is None
    out.backward(gq)
    r["qk_columns_grad_equal"] = torch.equal(leaf.grad, g2[0])
    g, u, gy = (torch.randn(7, 300).to(bf) for _ in range(3))
    compare("silu", T.silu_mul, F.silu_mul_ref, [g, u], [gy])
    # gate / up as the column views of one grouped output: d(gate), d(up) come back side by side in one buffer
    from nemo_jetrl.utils.columns import adjacent_columns

    class Split(torch.autograd.Function):
        @staticmethod
        def forward(ctx, base):
            return tuple(base.split([300, 300], -1))

        @staticmethod
        def backward(ctx, *grads):
            r["silu_views_adjacent"] = adjacent_columns(grads)
            return torch.cat(grads, -1)

    # an FP8 down_proj that makes SiLU * up inside its autograd function (the trainer's MLP): the plain call's bits
    from nemo_jetrl.precision import Fp8Linear
    from nemo_jetrl.precision.op_input_linear import linear_after

    torch.manual_seed(2)
    down = Fp8Linear(300, 64, bias=False, recipe=PrecisionRecipe.preset("jetrl"), dtype=bf)
    gd = torch.randn(7, 64).to(bf)
    (o1, g1), (o2, g2) = (run(lambda a, b: linear_after(down, T.SiluMulInput, a, b), [g, u], [gd]),
                          run(lambda a, b: down(T.silu_mul(a, b)), [g, u], [gd]))
    r["silu_down_bitwise"] = [torch.equal(a, b) for a, b in zip((*o1, *g1), (*o2, *g2))]
    base = torch.cat([g, u], -1).requires_grad_()
    T.silu_mul(*Split.apply(base)).backward(gy)
    _, (dg, du) = run(T.silu_mul, [g, u], [gy])
    r["silu_views_grad_equal"] = torch.equal(base.grad, torch.cat([dg, du], -1))

    # the trainer's path: left-padded rows, fused glue, FP8 linears; logprobs and parameter gradients, against
    # the eager path and (bf16) an FP64 copy of the model
    def trainer_pass(model, fast, checkpointing=False):
        model.zero_grad()
        logp = sequence_logprobs(model, ids, mask, fused_train=fast, causal_attention=fast,
                                 activation_checkpointing=checkpointing)
        (logp * torch.linspace(0.5, 1.5, 6, dtype=logp.dtype)).sum().backward()
        grads = torch.cat([p.grad.double().flatten() for p in model.parameters() if p.grad is not None])
        return logp.detach().double(), grads

    # 18 tokens (each a program of every glue kernel under the interpreter): a row with 2 leading pads (rotated
    # by the left alignment), one with 2 trailing pads, one full
    ids = torch.randint(3, 30, (3, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, 4:] = 0
    ref_logp, ref_grads = trainer_pass(random_tiny_qwen3(0, num_layers=2).double(), False)
    for name, fp8 in (("bf16", False), ("fp8", True)):
        model = random_tiny_qwen3(0, num_layers=2).to(bf)
        if fp8:
            convert_to_fp8(model, PrecisionRecipe.preset("jetrl"))
        (fast_logp, fast_grads), (eager_logp, eager_grads) = trainer_pass(model, True), trainer_pass(model, False)
        r[name + "_pads_zero"] = bool((fast_logp[mask == 0] == 0).all())
        r[name + "_logp_err"] = [float((x - ref_logp).abs().max()) for x in (fast_logp, eager_logp)]
        r[name + "_grad_err"] = [rel(x, ref_grads) for x in (fast_grads, eager_grads)]
        # activation checkpointing (each layer keeps the residual sum made before it): the fused path to the bit
        ckpt_logp, ckpt_grads = trainer_pass(model, True, checkpointing=True)
        r[name + "_checkpointed_bitwise"] = [torch.equal(ckpt_logp, fast_logp), torch.equal(ckpt_grads, fast_grads)]
    print(json.dumps(r))
    """
)


@pytest.fixture(scope="module")
def interpreted(run_interpreted) -> dict:
    return run_interpreted(CHILD)


@pytest.mark.parametrize("name", ["add_norm", "norm", "qk_norm_rope", "rope", "rope_t", "silu"])
def test_forward_is_bitwise_and_gradients_as_accurate_as_eager(interpreted, name):
    assert interpreted[f"{name}_fwd_equal"]
    fused, eager = interpreted[f"{name}_grad_err"], interpreted[f"{name}_eager_err"]
    assert len(fused) == len(eager) >= 1
    for f, e in zip(fused, eager):
        assert 0 < e < 1e-2  # bf16 autograd is inexact: the comparison has teeth
        assert f <= 1.05 * e + 1e-7, (name, fused, eager)


def test_silu_backward_writes_grouped_gate_up_gradients_side_by_side(interpreted):
    # the grouped gate/up's gradient joins without a copy (utils.columns.join_columns), bitwise the separate ones
    assert interpreted["silu_views_adjacent"] is True
    assert interpreted["silu_views_grad_equal"] is True


def test_an_fp8_down_proj_making_silu_mul_itself_gives_the_plain_bits(interpreted):
    # output, d gate, d up (the weight gradient: tests/unit/precision/test_op_input_linear.py)
    assert interpreted["silu_down_bitwise"] == [True] * 3


def test_q_k_as_column_views_keep_only_their_own_columns_to_the_backward(interpreted):
    assert interpreted["qk_columns_bitwise"] == [True] * 3  # output, d q, d weight
    assert interpreted["qk_columns_buffer_freed"] is True and interpreted["qk_columns_grad_equal"] is True


def test_a_residual_sum_made_before_the_norm_is_the_fused_add_to_the_bit(interpreted):
    # residual, normed output, and the gradients of x, delta and the norm weight
    assert interpreted["residual_sum_bitwise"] == [True] * 5


def test_checkpointed_fused_trainer_pass_is_bitwise_the_plain_one(interpreted):
    # loss-side logprobs and every parameter gradient, BF16 and FP8 linears
    for name in ("bf16", "fp8"):
        assert interpreted[f"{name}_checkpointed_bitwise"] == [True, True], name


def test_trainer_fast_path_is_as_accurate_as_the_eager_path(interpreted):
    for name in ("bf16", "fp8"):
        assert interpreted[f"{name}_pads_zero"]
        # logprobs (a left-padded row is rotated) and gradients: no further from the FP64 model than eager bf16
        (fast_logp, eager_logp), (fast_grad, eager_grad) = (
            interpreted[f"{name}_logp_err"],
            interpreted[f"{name}_grad_err"],
        )
        assert 0 < eager_logp and fast_logp <= 1.5 * eager_logp, (name, fast_logp, eager_logp)
        assert 0 < eager_grad and fast_grad <= 1.5 * eager_grad, (name, fast_grad, eager_grad)


def test_left_align_index_moves_leading_pads_behind_the_last_token():
    mask = torch.tensor([[0, 0, 1, 1, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [0, 1, 1, 1, 1]])
    index = left_align_index(mask)
    assert index.tolist() == [[2, 3, 4, 0, 1], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]
    aligned = mask.gather(1, index)
    assert aligned.tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 0, 0, 0, 0], [1, 1, 1, 1, 0]]
    assert _right_padded(aligned) and not _right_padded(mask)
    values = torch.arange(20.0).view(4, 5)
    assert torch.equal(torch.zeros_like(values).scatter(1, index, values.gather(1, index)), values)
