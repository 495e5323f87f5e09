"""A CPU stand-in for liger-kernel's Triton launches, so liger's own Python path (its patched Llama forward,
its autograd Functions, their dtype handling and autocast decorators) runs on gloo ranks.

Only the lowest layer is replaced: the functions that launch a Triton kernel (rms_norm, rope, swiglu forward
and backward), and for the fused linear cross entropy, whose matmuls and dtype choices sit in the same
function as the launch, the two kernel objects themselves (``kernel[grid](...)`` runs a torch reference that
writes the same outputs in place). Each stand-in counts its calls, so a test can see liger's path ran.
"""

from __future__ import annotations

from collections import Counter

import torch

CALLS: Counter[str] = Counter()


def _rms_norm_forward(X, W, eps, offset, casting_mode, row_mode):
    from liger_kernel.ops import rms_norm

    CALLS["rms_norm"] += 1
    mode = rms_norm._str_to_casting_mode[casting_mode] if isinstance(casting_mode, str) else casting_mode
    assert mode == rms_norm._CASTING_MODE_LLAMA.value, "the stand-in models Llama's casting only"
    shape = X.shape
    X = X.reshape(-1, shape[-1])
    rstd = torch.rsqrt(X.float().pow(2).mean(-1) + eps)
    # llama casting: only the inverse RMS in fp32, the normalised row back in X's dtype, then times W
    Y = ((X.float() * rstd[:, None]).to(X.dtype) * (offset + W)).to(X.dtype)
    BLOCK_SIZE, num_warps = rms_norm.calculate_settings(shape[-1])
    return Y.view(*shape), X, rstd, BLOCK_SIZE, num_warps, mode


def _rms_norm_backward(dY, X, W, RSTD, offset, casting_mode, BLOCK_SIZE, num_warps, in_place, row_mode, needs_dw=None):
    CALLS["rms_norm_backward"] += 1
    shape = dY.shape
    dy = dY.reshape(-1, shape[-1]).float()
    xhat = X.float() * RSTD[:, None]
    m = dy * (offset + W.float()) if W is not None else dy
    dX = (RSTD[:, None] * (m - xhat * (m * xhat).mean(-1, keepdim=True))).to(dY.dtype)
    compute_dw = W is not None and (needs_dw is None or needs_dw)
    dW = (dy * xhat).sum(0).to(W.dtype) if compute_dw else None
    return dX.view(*shape), dW


def _half_turn(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rope_tables(cos, sin, unsqueeze_dim):
    if cos.ndim == 4:
        cos, sin = cos.squeeze(unsqueeze_dim), sin.squeeze(unsqueeze_dim)
    if cos.ndim == 2:
        cos, sin = cos.unsqueeze(0), sin.unsqueeze(0)
    return cos, sin


def _rope_forward(q, k, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
    CALLS["rope"] += 1
    assert rotary_dim in (None, q.shape[-1]), "the stand-in rotates the whole head"
    cos, sin = _rope_tables(cos, sin, unsqueeze_dim)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)  # q, k: batch, heads, sequence, head_dim
    turn = lambda x: (x * c + _half_turn(x) * s).to(x.dtype)  # noqa: E731
    return turn(q), turn(k), cos, sin


def _rope_backward(dq, dk, cos, sin, position_ids=None, unsqueeze_dim=1, rotary_dim=None):
    CALLS["rope_backward"] += 1
    cos, sin = _rope_tables(cos, sin, unsqueeze_dim)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    back = lambda g: (g * c - _half_turn(g * s)).to(g.dtype)  # noqa: E731  the rotation's transpose
    return back(dq), back(dk)


def _swiglu_forward(a, b, gate_multiplier: float = 1.0):
    CALLS["swiglu"] += 1
    gate = a.float() * gate_multiplier
    return a, b, (torch.nn.functional.silu(gate) * b.float()).to(a.dtype)


def _swiglu_backward(a, b, dc, gate_multiplier: float = 1.0):
    CALLS["swiglu_backward"] += 1
    gate, up, grad = a.float() * gate_multiplier, b.float(), dc.float()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    # the kernel overwrites a and b with their gradients
    da = grad * up * sig * (1 + gate * (1 - sig)) * gate_multiplier
    return da.to(a.dtype), (grad * silu).to(b.dtype)


class _Launcher:
    """``kernel[grid](...)`` for a replaced Triton kernel: calls ``run(**arguments)`` once for the whole grid."""

    def __init__(self, run):
        self.run = run

    def __getitem__(self, grid):
        return self.run


def _cross_entropy_rows(*, X_ptr, Y_ptr, loss_ptr, n_cols, n_non_ignore, ignore_index, reduction, **options):
    """liger_cross_entropy_kernel: per row the loss, and the row's logits overwritten by their gradient."""
    CALLS["cross_entropy"] += 1
    plain = (
        options["weight_ptr"] is None
        and options["softcap"] is None
        and options["lse_square_scale"] == 0
        and options["label_smoothing"] == 0
        and not options["RETURN_Z_LOSS"]
        and not options["RETURN_TOKEN_ACCURACY"]
        and not options["RETURN_PREDICTED_TOKENS"]
    )
    assert plain, "the stand-in models the plain cross entropy the SFT loss uses"
    logits = X_ptr.float()
    kept = Y_ptr != ignore_index
    target = torch.where(kept, Y_ptr, 0)
    lse = torch.logsumexp(logits, dim=-1)
    loss = (lse - logits.gather(-1, target[:, None]).squeeze(-1)) * kept
    grad = torch.softmax(logits, dim=-1)
    grad[torch.arange(len(target)), target] -= 1
    grad *= kept[:, None]
    if reduction == "mean":
        count = float(n_non_ignore)
        loss, grad = loss / count, grad / count
    loss_ptr.copy_(loss)
    if options["HAS_GRADIENTS"]:
        X_ptr.copy_(grad.to(X_ptr.dtype))


def _element_mul(X, X_stride, grad_output, n_cols, BLOCK_SIZE, X_col_stride=1, num_warps=None):
    CALLS["element_mul"] += 1
    X.copy_((X.float() * grad_output.float()).to(X.dtype))


def install() -> None:
    """Replace liger-kernel's Triton launches with the torch references above (for this process)."""
    from liger_kernel.ops import fused_linear_cross_entropy, rms_norm, rope, swiglu

    rms_norm.rms_norm_forward, rms_norm.rms_norm_backward = _rms_norm_forward, _rms_norm_backward
    rope.rope_forward, rope.rope_backward = _rope_forward, _rope_backward
    swiglu.swiglu_forward, swiglu.swiglu_backward = _swiglu_forward, _swiglu_backward
    fused_linear_cross_entropy.liger_cross_entropy_kernel = _Launcher(_cross_entropy_rows)
    fused_linear_cross_entropy.element_mul_kernel = _Launcher(_element_mul)
