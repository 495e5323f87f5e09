"""train.liger_kernel under FSDP2 in bf16 (the CUDA image's defaults: liger "auto" is on there, parallel.strategy
fsdp), on 2 gloo ranks: liger's own patched Llama modules and autograd Functions, with only their Triton launches
replaced by torch references (liger_standin.py). The decoder layers hand back fp32 (the engine's FSDP2
output_dtype) into bf16 weights; the run must train as the same run without liger does, for an adapter and for
full fine-tuning.

trl 1.16's SFTTrainer turns liger's fused linear cross entropy off (its own fused LM head computes the loss,
in both runs), so liger brings the norms, rotary and SwiGLU. Were liger's fused loss used, it reads
lm_head.weight (bf16) with fp32 hidden states: accelerate runs the forward under bf16 autocast (FSDP2 included)
and liger's Function keeps that autocast, so its matmul is bf16; the last test checks that contract."""

from __future__ import annotations

import pytest
from engine_launch import PRECISION_STEPS as STEPS
from engine_launch import run_engine, write_precision_run
from payload_configs import folder_env

pytestmark = [pytest.mark.xdist_group("torch_engine"), pytest.mark.engine]
METHODS = ("lora", "full")
RANKS = 2
# measured: the liger and eager losses differ by at most 2e-5 relative (bf16 compute rounds differently)
LOSS_RTOL = 1e-4


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_models_dir, tiny_datasets_dir, precision_runs) -> dict[str, dict]:
    """'<method>-<liger|eager>' -> what the probe measured on 2 FSDP2 ranks: the liger runs in their own launch
    (liger's stand-in patches the process), the eager ones test_train_precision.py's runs of the same shape."""
    folder = tmp_path_factory.mktemp("liger")
    env = folder_env(folder, tiny_models_dir, tiny_datasets_dir)
    paths = [write_precision_run(folder, env, method, RANKS, liger_kernel=True) for method in METHODS]
    liger = run_engine(paths, folder / "liger.json", ranks=RANKS, liger_standin=True)
    answer = {f"{path.stem.split('-', 1)[0]}-liger": liger[path.stem] for path in paths}
    return answer | {f"{method}-eager": precision_runs[RANKS][method] for method in METHODS}


@pytest.mark.parametrize("method", METHODS)
def test_liger_trains_under_fsdp2_in_bf16_like_the_run_without_it(runs, method):
    liger, eager = runs[f"{method}-liger"], runs[f"{method}-eager"]
    # liger's path ran: its norms, rotary and SwiGLU, forward and backward; trl keeps its own fused loss
    kernels = {"rms_norm", "rope", "swiglu", "rms_norm_backward", "rope_backward", "swiglu_backward"}
    assert set(liger["liger_calls"]) == kernels
    assert eager["liger_calls"] == {}
    assert liger["trl_liger_switch"] is eager["trl_liger_switch"] is False  # not trl's deprecated switch
    assert len(liger["losses"]) == STEPS
    assert liger["losses"] == pytest.approx(eager["losses"], rel=LOSS_RTOL)
    assert liger["loss_dtypes"] == eager["loss_dtypes"] == ["float32"]
    assert liger["changed_fraction"] == pytest.approx(eager["changed_fraction"], abs=0.01)


def test_liger_fused_loss_takes_fp32_hidden_states_against_a_bf16_weight_under_bf16_autocast():
    import liger_standin
    import torch
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    liger_standin.install()
    torch.manual_seed(0)
    hidden = torch.randn(12, 16, requires_grad=True)  # what the fp32 output_dtype hands on
    weight = torch.randn(40, 16, dtype=torch.bfloat16)  # lm_head.weight as FSDP2 gathers it
    target = torch.randint(0, 40, (12,))
    target[:3] = -100
    with pytest.raises(RuntimeError, match="same dtype"):  # outside autocast: the mismatch the issue saw
        LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, target)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # as accelerate wraps the model's forward
        loss = LigerFusedLinearCrossEntropyFunction.apply(hidden, weight, target)[0]
    loss.backward()
    reference_hidden = hidden.detach().clone().requires_grad_()
    logits = (reference_hidden.bfloat16() @ weight.t()).float()
    reference = torch.nn.functional.cross_entropy(logits, target, ignore_index=-100)
    reference.backward()
    assert liger_standin.CALLS["cross_entropy"] > 0
    assert loss.item() == pytest.approx(reference.item(), rel=1e-3)
    assert torch.allclose(hidden.grad, reference_hidden.grad, rtol=2**-6, atol=1e-4)
