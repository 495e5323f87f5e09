"""The Trainium2 first-node acceptance command on CPU: its device checks report "not a Neuron host",
the 8B and two-node checks "needs a trn2 node", and the rest (the tiny CPU reference, the engine's
save-stop-resume) runs, so the command cannot rot before a trn2 node runs it. It cannot lie either: a
device whose optimizer does nothing, whose parameters are frozen, or that silently ran on the CPU FAILs
the tiny check (each broken device run here on the CPU), two ranks on one device FAIL the ranks check
(a real two-rank torchrun), and a skipped hardware check exits 1 unless --offline says it is intended."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch
from engine_launch import engine_env
from payload_configs import write_config

from llm_pipeline import trn2_acceptance
from llm_pipeline.run_files import ProgressLine, TrainableLine
from llm_pipeline.training import fleet_reference, tiny_task

pytestmark = [pytest.mark.main_stack, pytest.mark.engine]


def test_acceptance_on_cpu_skips_the_device_checks_and_runs_the_rest(hpl_env, tmp_path, monkeypatch, capsys):
    for name, value in hpl_env.items():
        monkeypatch.setenv(name, value)
    tiny = write_config(tmp_path / "tiny.toml", hpl_env)
    report = tmp_path / "report"
    assert (
        trn2_acceptance.main(["--on-node", "--report-dir", str(report), "--tiny-config", str(tiny), "--offline"]) == 0
    )
    out = capsys.readouterr().out
    checks = {c["name"]: c for c in json.loads((report / "node.json").read_text())["checks"]}
    names = ["device", "tiny-parity", "graph-count", "cpu-fallbacks", "resume", "ranks", "collectives", "lora-8b"]
    assert list(checks) == names
    for name in ("device", "graph-count", "cpu-fallbacks"):
        assert (checks[name]["status"], checks[name]["detail"]) == ("SKIP", "not a Neuron host")
    parity = checks["tiny-parity"]
    assert parity["status"] == "SKIP" and parity["detail"].startswith("not a Neuron host (the CPU reference learned")
    losses = parity["figures"]["cpu_losses"]
    assert len(losses) == tiny_task.STEPS and tiny_task.learned(losses)  # the reference really learned
    assert checks["resume"]["status"] == "PASS", checks["resume"]["detail"]
    assert checks["resume"]["figures"]["resumed"] == pytest.approx(
        checks["resume"]["figures"]["uninterrupted"], abs=1e-3
    )
    assert checks["lora-8b"]["detail"] == checks["ranks"]["detail"] == checks["collectives"]["detail"]
    assert checks["lora-8b"]["detail"] == "needs a trn2 node"
    table = (report / "node.md").read_text()
    assert "| resume | PASS |" in table and "| tiny-parity | SKIP | - | <= 0.02 a step |" in table
    assert "SKIP  device         not a Neuron host" in out and "no check failed (7 skipped, --offline)" in out
    assert "verdict:" in out
    print(out)  # the docs' table quotes these lines (docs/trainium2.md, "CPU --offline run")


def test_a_skipped_hardware_check_fails_without_offline(capsys):
    checks = [trn2_acceptance.Check("resume", "PASS", ""), trn2_acceptance.Check("device", "SKIP", "not a Neuron host")]
    assert trn2_acceptance.outcome(checks, offline=False)[0] == 1
    assert trn2_acceptance.outcome(checks, offline=True) == (0, "no check failed (1 skipped, --offline)")
    with pytest.raises(SystemExit) as stopped:
        trn2_acceptance.main([])  # no --report-dir
    assert stopped.value.code == 2 and "--report-dir is required" in capsys.readouterr().err


class NoOpOptimizer:
    """A device whose optimizer step changes nothing."""

    def step(self) -> None:
        pass

    def zero_grad(self) -> None:
        pass


class GradientFault:
    """The real optimizer, with the gradients changed before each step (``change(step, parameter)``)."""

    def __init__(self, optimizer, change) -> None:
        self.optimizer, self.change, self.steps = optimizer, change, 0

    def step(self) -> None:
        for group in self.optimizer.param_groups:
            for parameter in group["params"]:
                if parameter.grad is not None:
                    self.change(self.steps, parameter)
        self.steps += 1
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad()


def no_op_optimizer(model, optimizer):
    return NoOpOptimizer()


def frozen_parameters(model, optimizer):
    """Every parameter frozen but the final norm's weight (all frozen would stop backward with an error)."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(name == "model.norm.weight")
    return optimizer


def frozen_layers(model, optimizer):
    """The decoder layers frozen; embeddings, norm and head still train (a bigram the head alone can learn)."""
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(".layers." not in name)
    return optimizer


def flipped_gradients(model, optimizer):
    return GradientFault(optimizer, lambda step, p: p.grad.neg_())


def noisy_gradients(model, optimizer):
    generator = torch.Generator().manual_seed(1)
    return GradientFault(optimizer, lambda step, p: p.grad.add_(torch.randn(p.grad.shape, generator=generator)))


def learning_rate(factor):
    def mutate(model, optimizer):
        for group in optimizer.param_groups:
            group["lr"] *= factor
        return optimizer

    mutate.__name__ = f"learning_rate_x{factor}"
    return mutate


def every_other_step_dropped(model, optimizer):
    """Half the updates lost (a step whose gradients never arrive)."""
    return GradientFault(optimizer, lambda step, p: p.grad.zero_() if step % 2 else None)


def gradients_never_cleared(model, optimizer):
    """zero_grad does nothing: each step applies the sum of every gradient so far."""
    faulty = GradientFault(optimizer, lambda step, p: None)
    faulty.zero_grad = lambda: None
    return faulty


def nan_at_step_five(model, optimizer):
    """One weight goes NaN after the fifth update (an overflow on the device)."""
    weight = model.lm_head.weight
    return GradientFault(optimizer, lambda step, p: p.grad.fill_(math.nan) if step == 5 and p is weight else None)


def fp8_matmuls(model, optimizer):
    """Every linear layer's output rounded to fp8 e4m3: a device computing coarser than bf16."""

    def round_output(module, inputs, output):
        return output.to(torch.float8_e4m3fn).to(output.dtype)

    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(round_output)
    return optimizer


# The device faults the tiny check must FAIL, each run on the CPU against the CPU reference. The CPU
# fallback (a run that never left the CPU) is the eleventh, below: only where the run lived tells it.
FAULTS = [
    no_op_optimizer,
    frozen_parameters,
    frozen_layers,
    flipped_gradients,
    noisy_gradients,
    learning_rate(10.0),
    learning_rate(0.1),
    every_other_step_dropped,
    gradients_never_cleared,
    nan_at_step_five,
    fp8_matmuls,
]


@pytest.fixture(scope="module")
def cpu_reference() -> tiny_task.TinyRun:
    return trn2_acceptance.train_tiny("cpu")


FAULT_STEPS = 8  # every fault is off the CPU by more than PARITY_RTOL within 8 steps (the NaN from step 7)


@pytest.fixture(scope="module")
def short_reference() -> tiny_task.TinyRun:
    return trn2_acceptance.train_tiny("cpu", steps=FAULT_STEPS)


def test_an_honest_run_passes_the_tiny_check(cpu_reference):
    check = trn2_acceptance.parity_check("cpu", cpu_reference, trn2_acceptance.train_tiny("cpu"))
    assert check.status == "PASS", check.detail
    assert check.figures["device_losses"][-1] < 0.3 * check.figures["device_losses"][0]


def test_a_healthy_bf16_device_passes_the_tiny_and_matmul_checks(cpu_reference):
    """A device that computes its fp32 matmuls in bf16 (neuronx-cc's auto-cast; the CPU under bf16
    autocast stands in for it) passes both bounds; one computing in fp8 fails the matmul bound."""
    bf16 = trn2_acceptance.train_tiny("cpu", matmul_dtype=torch.bfloat16)
    check = trn2_acceptance.parity_check("cpu", cpu_reference, bf16)
    assert check.status == "PASS", check.detail
    assert 0 < check.figures["max_relative_difference"] < tiny_task.PARITY_RTOL / 10
    device = trn2_acceptance.matmul_check("cpu", 1, torch.bfloat16)
    assert device.status == "PASS", device.detail
    assert device.figures["matmul_difference"] > 1e-3  # really bf16: the old 1e-3 bound would have failed it
    assert trn2_acceptance.matmul_check("cpu", 1, torch.float8_e4m3fn).status == "FAIL"


@pytest.mark.parametrize("mutation", FAULTS, ids=[fault.__name__ for fault in FAULTS])
def test_a_faulty_device_fails_the_tiny_check(short_reference, mutation):
    broken = trn2_acceptance.train_tiny("cpu", steps=FAULT_STEPS, mutate=mutation)
    check = trn2_acceptance.parity_check("cpu", short_reference, broken)
    assert check.status == "FAIL", check.detail
    assert "differs from the CPU" in check.detail


def test_a_cpu_fallback_fails_the_tiny_check(tmp_path):
    """The device's run that really ran on the CPU: the same losses as the reference, so only where the
    parameters and the loss lived can tell, and the check asks."""
    parity, *_ = trn2_acceptance.check_tiny("neuron", tmp_path, device_run=trn2_acceptance.train_tiny("cpu"))
    assert parity.status == "FAIL" and "ran on cpu, not neuron only" in parity.detail
    assert parity.figures["max_relative_difference"] == 0.0


def test_two_ranks_on_one_device_fail_the_ranks_check():
    """A real two-rank torchrun of the rank probe on the CPU: both ranks share the one device, so FAIL;
    the same probes on two cores pass."""
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]
    command = [*launch, "-m", "llm_pipeline.trn2_acceptance", "--rank-probe"]
    done = subprocess.run(command, env=engine_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    probes = trn2_acceptance.acceptance_launch.read_probes(done.stdout)
    assert sorted((p["rank"], p["local_rank"], p["device"]) for p in probes) == [(0, 0, "cpu"), (1, 1, "cpu")]
    check = trn2_acceptance.ranks_verdict(probes, 2)
    assert check.status == "FAIL" and "ranks 0, 1 share cpu (cores not set)" in check.detail
    collectives = trn2_acceptance.collectives_verdict(trn2_acceptance.read_collectives(done.stdout), 2, nodes=1)
    assert collectives.status == "PASS", collectives.detail
    assert collectives.figures["bus_gbps"] > 0
    on_two_cores = [{**probe, "cores": str(probe["rank"])} for probe in probes]
    assert trn2_acceptance.ranks_verdict(on_two_cores, 2).status == "PASS"
    assert trn2_acceptance.ranks_verdict(on_two_cores[:1], 2).status == "FAIL"  # a rank missing


def test_the_cpu_reference_is_reproducible_from_its_seed():
    """The parity check compares two devices from one seed: on one device the seed must decide everything."""
    first, second = trn2_acceptance.train_tiny("cpu", steps=3), trn2_acceptance.train_tiny("cpu", steps=3)
    assert first.losses == second.losses and first.graphs == [] and first.fallbacks == []
    assert first.ran_on == ["cpu"]


def test_the_fallback_count_says_its_pattern_is_unconfirmed():
    seen = ["op aten::_foo.bar falls back to the CPU", "aten::baz: fallback", "unrelated warning"]
    found = [message for message in seen if trn2_acceptance.FALLBACK_WORDS.search(message)]
    check = trn2_acceptance.fallback_check(found)
    assert check.figures["operators"] == ["aten::_foo.bar", "aten::baz"]
    assert "2 fallback report(s)" in check.detail and "unconfirmed" in check.detail
    assert check.figures["confirmed"] is False


WRONG_ON_RANK_ONE = """
import sys
import torch.distributed as dist
from llm_pipeline import trn2_acceptance

real_all_reduce = dist.all_reduce


def all_reduce(tensor, *args, **kwargs):
    work = real_all_reduce(tensor, *args, **kwargs)
    if dist.get_rank() == 1:
        tensor.add_(1)  # this rank's interconnect hands back a wrong sum
    return work


dist.all_reduce = all_reduce
sys.exit(trn2_acceptance.main(["--rank-probe"]))
"""


def test_a_collective_wrong_on_one_rank_fails_the_collectives_check(tmp_path):
    """A real two-rank gloo run whose all-reduce hands rank 1 a wrong sum: the check names rank 1."""
    script = tmp_path / "wrong_on_rank_one.py"
    script.write_text(WRONG_ON_RANK_ONE)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes=1", "--nproc_per_node=2"]
    done = subprocess.run([*command, str(script)], env=engine_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    check = trn2_acceptance.collectives_verdict(trn2_acceptance.read_collectives(done.stdout), 2, nodes=1)
    assert check.status == "FAIL" and "rank(s) 1 got wrong values" in check.detail
    assert check.figures["wrong_ranks"] == [1]


def progress_output(losses: list[float]) -> str:
    """A training run's output as the engine prints it: the trainable line, then a progress line a step."""
    lines = [TrainableLine("lora", "6,815,744", "").format()]
    for step, loss in enumerate(losses, 1):
        line = ProgressLine(step, len(losses), loss, 2e-5, 60.0, 61440.0, "0:00:01", ("peak mem 20.00 GB",))
        lines.append(line.format())
    return "\n".join(lines) + "\n"


TWO_NODE_STEPS = trn2_acceptance.TWO_NODE_STEPS


@pytest.fixture(scope="module")
def ten_step_run() -> tiny_task.TinyRun:
    return tiny_task.train("cpu", steps=TWO_NODE_STEPS)


def test_the_loss_reference_file_is_what_its_script_records(ten_step_run):
    """payloads/.../loss_reference.json against a fresh CPU run (python -m tools.record_loss_reference)."""
    recorded = fleet_reference.reference_curve(TWO_NODE_STEPS)
    assert ten_step_run.losses == pytest.approx(recorded, abs=1e-5)
    assert len(fleet_reference.reference_curve(trn2_acceptance.LORA_STEPS)) == trn2_acceptance.LORA_STEPS


@pytest.mark.parametrize(
    ("mutation", "matmul_dtype", "ending"),
    [
        (None, None, None),
        (None, torch.bfloat16, None),
        (flipped_gradients, None, "the loss rose"),
        (no_op_optimizer, None, "the loss stayed flat"),
        (nan_at_step_five, None, "the loss went NaN or infinite at step 7"),
    ],
    ids=["healthy", "healthy-bf16", "rises", "flat", "nan"],
)
def test_a_fleet_level_passes_a_falling_loss_and_fails_one_that_rises_stays_flat_or_goes_nan(
    mutation, matmul_dtype, ending
):
    """The two-node level's verdict on the output of real 10-step CPU runs (the device stand-ins)."""
    run = tiny_task.train("cpu", steps=TWO_NODE_STEPS, mutate=mutation, matmul_dtype=matmul_dtype)
    check = trn2_acceptance.training_verdict("two-node", progress_output(run.losses), nodes=2)
    if ending is None:
        assert check.status == "PASS", check.detail
        assert check.figures["relative_fall"] >= check.figures["bound_relative_fall"] > 0
        assert "peak device memory 20.00 GB" in check.detail and "60.0 samples/s" in check.detail
    else:
        assert check.status == "FAIL" and ending in check.detail, check.detail


def test_the_lnc_the_ranks_assume_is_read_and_checked():
    assert trn2_acceptance.read_lnc({}) == ("2", "")
    assert trn2_acceptance.read_lnc({"NEURON_LOGICAL_NC_CONFIG": "2"}) == ("2", "")
    value, problem = trn2_acceptance.read_lnc({"NEURON_LOGICAL_NC_CONFIG": "1"})
    assert value == "1" and problem.startswith("NEURON_LOGICAL_NC_CONFIG=1, but the partition's ranks")


def test_the_verdict_table_names_each_figure_and_its_bound():
    checks = [
        trn2_acceptance.matmul_check("cpu", 1, torch.bfloat16),
        trn2_acceptance.collectives_verdict([], 2, nodes=2),
        trn2_acceptance.Check("resume", "PASS", ""),
    ]
    rows = trn2_acceptance.verdict_rows(checks)
    assert rows[0][:2] == ("device", "PASS") and rows[0][3] == f"{tiny_task.MATMUL_RTOL:.4g}"
    assert rows[1] == ("collectives-2-nodes", "FAIL", "0", "exact values on every rank")
    assert rows[2] == ("resume", "PASS", "-", "-")
