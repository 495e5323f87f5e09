"""The pins file and the build-time check that holds the image to it (payloads/image/verify_env.py)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from image_files import REQUIREMENTS, VERIFY_ENV

# Each CLI run below imports the family's stack (torch, transformers, liger's patch): the tests read two shared
# runs, one per family, rather than each starting its own.
pytestmark = pytest.mark.xdist_group("verify_env")


def test_every_requirement_line_is_an_exact_pin(pins):
    lines = [line.split("#", 1)[0].strip() for line in REQUIREMENTS.read_text().splitlines()]
    assert len(pins) == len([line for line in lines if line])
    for name in ("optimum-neuron", "torch-neuronx", "neuronx-cc", "neuronx-distributed", "trl", "peft"):
        assert name in pins, f"{name} missing from requirements-cluster.txt"


@pytest.mark.parametrize(
    "line, reason",
    [
        ("trl>=0.24.0", "exact version"),
        ("trl~=0.24.0", "exact version"),
        ("trl==0.24.*", "exact version"),
        ("trl", "exact version"),
        ("trl==0.24.0; python_version < '3.12'", "environment marker"),
        ("--extra-index-url https://example.invalid", "not a requirement"),
        ("trl==0.24.0\nTRL==0.24.0", "pinned twice"),
    ],
)
def test_read_pins_rejects_anything_but_one_exact_pin(verify_env, tmp_path, line, reason):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"# header\npeft==0.17.0\n{line}\n")
    with pytest.raises(verify_env.PinError, match=reason):
        verify_env.read_pins(requirements)


def test_version_check_flags_missing_and_drifted_packages(verify_env):
    installed_packaging = metadata.version("packaging")
    problems = verify_env.version_problems(
        {"packaging": installed_packaging, "pytest": "0.0.1", "no-such-distribution-here": "1.0"}
    )
    assert problems == [
        "no-such-distribution-here: not installed (pinned 1.0)",
        f"pytest: installed {metadata.version('pytest')}, pinned 0.0.1",
    ]


def test_version_check_ignores_local_labels_like_pip(verify_env, tmp_path, monkeypatch):
    # Neuron's wheels carry +<commit> labels and torch's CPU build +cpu: `==` ignores both, and so does the check.
    # A distribution of its own, so the check does not depend on which torch build this machine has.
    info = tmp_path / "labelled_package-2.8.0+4f2a9c1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: labelled-package\nVersion: 2.8.0+4f2a9c1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert metadata.version("labelled-package") == "2.8.0+4f2a9c1"
    assert verify_env.version_problems({"labelled-package": "2.8.0"}) == []
    assert verify_env.version_problems({"labelled-package": "2.8.1"}) == [
        "labelled-package: installed 2.8.0+4f2a9c1, pinned 2.8.1"
    ]


def test_import_check_flags_missing_modules_and_names(verify_env):
    problems = verify_env.import_problems((("json", ("dumps", "no_such_name")), ("no_such_module_here", ())))
    assert problems[0] == "json.no_such_name: missing"
    assert problems[1].startswith("import no_such_module_here: ModuleNotFoundError")
    assert len(problems) == 2


def test_import_check_covers_the_training_classes(verify_env):
    wanted = dict(verify_env.KEY_IMPORTS)
    assert set(wanted["optimum.neuron"]) == {"NeuronSFTTrainer", "NeuronSFTConfig", "NeuronTrainingArguments"}
    assert wanted["optimum.neuron.models.training"] == ("NeuronModelForCausalLM",)
    assert {"torch_neuronx", "neuronx_distributed", "transformers", "trl", "peft"} <= set(wanted)


def run_check(requirements) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(VERIFY_ENV), str(requirements)], capture_output=True, text=True)


def test_cli_bad_requirements_file_is_a_clear_usage_error(tmp_path):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("trl>=0.24\n")
    result = run_check(requirements)
    assert result.returncode == 2
    assert result.stdout.startswith("error: requirements.txt:1:")
    assert "Traceback" not in result.stderr
    assert run_check(tmp_path / "absent.txt").returncode == 2


@pytest.fixture(scope="module")
def neuron_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """The default (Neuron) family where a pin is not installed, as in a base image that lost it."""
    requirements = tmp_path_factory.mktemp("neuron") / "requirements.txt"
    requirements.write_text("packaging==0.0.1\n")
    return run_check(requirements)


@pytest.fixture(scope="module")
def cuda_run(tmp_path_factory) -> subprocess.CompletedProcess:
    """The CUDA family on the -sagemaker variant, every pin installed: what fails is what this machine lacks."""
    requirements = tmp_path_factory.mktemp("cuda") / "requirements.txt"
    requirements.write_text("packaging==" + metadata.version("packaging") + "\n")
    command = [sys.executable, str(VERIFY_ENV), "--family", "cuda", "--variant", "sagemaker", str(requirements)]
    return subprocess.run(command, capture_output=True, text=True)


def test_cli_fails_the_build_when_a_pin_is_not_installed(neuron_run):
    # Here the Neuron packages are absent, as in a base image that lost them: the check must say so.
    assert neuron_run.returncode == 1
    assert "FAIL packaging: installed" in neuron_run.stdout
    assert "FAIL import torch_neuronx" in neuron_run.stdout


def test_cuda_image_needs_the_nccl_efa_plugin(verify_env, tmp_path):
    assert verify_env.file_problems("neuron", root=str(tmp_path)) == []  # the Neuron image has no NCCL
    (problem,) = verify_env.file_problems("cuda", root=str(tmp_path))
    assert "aws-ofi-nccl" in problem
    plugin = tmp_path / "opt/amazon/ofi-nccl/lib64"  # where the amzn2023 base's EFA installer puts it
    plugin.mkdir(parents=True)
    (plugin / "libnccl-net.so").write_bytes(b"")
    assert verify_env.file_problems("cuda", root=str(tmp_path)) == []


def test_cuda_image_steps_start_the_interpreter_holding_the_pins(verify_env, monkeypatch, tmp_path):
    """On the amzn2023 base the pins go into /opt/venv; a `python` or `python3` on PATH from elsewhere
    (the system Python) would start the steps without them."""
    here = Path(sys.executable).parent
    monkeypatch.setenv("PATH", str(here))
    assert verify_env.interpreter_problems("cuda") == []
    assert verify_env.interpreter_problems("neuron") == []  # the Neuron image keeps its base's Python
    other = tmp_path / "bin"
    other.mkdir()
    (other / "python3").symlink_to(sys.executable)  # the same binary, another directory: not this venv
    monkeypatch.setenv("PATH", f"{other}:{here}")
    (problem,) = verify_env.interpreter_problems("cuda")
    assert problem.startswith(f"`python3` on PATH is {other / 'python3'}, not the interpreter holding the pins")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert [p.split(" on PATH is ")[1].split(",")[0] for p in verify_env.interpreter_problems("cuda")] == [
        "missing",
        "missing",
    ]


def test_cli_checks_the_family_it_is_told(cuda_run):
    assert cuda_run.returncode == 1
    assert "key imports (cuda)" in cuda_run.stdout
    assert "FAIL NCCL EFA plugin (aws-ofi-nccl" in cuda_run.stdout  # this machine has no EFA stack


def test_the_base_variant_is_told_by_the_sagemaker_training_toolkit(verify_env, monkeypatch, tmp_path):
    """-sagemaker bases carry AWS's SageMaker training toolkit, -ec2 bases do not; this venv has none."""
    with pytest.raises(metadata.PackageNotFoundError):
        metadata.version(verify_env.VARIANT_MARKER)
    assert verify_env.variant_problems(None) == verify_env.variant_problems("ec2") == []
    (missing,) = verify_env.variant_problems("sagemaker")
    assert "sagemaker-training) is missing" in missing
    toolkit = tmp_path / "sagemaker_training-5.0.0.dist-info"  # what pip leaves for an installed toolkit
    toolkit.mkdir()
    (toolkit / "METADATA").write_text("Metadata-Version: 2.1\nName: sagemaker-training\nVersion: 5.0.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert verify_env.variant_problems("sagemaker") == []
    (installed,) = verify_env.variant_problems("ec2")
    assert "sagemaker-training) is installed" in installed


def test_cli_accepts_only_the_published_variants(tmp_path, cuda_run):
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("packaging==" + metadata.version("packaging") + "\n")
    refused = subprocess.run(
        [sys.executable, str(VERIFY_ENV), "--variant", "gpu", str(requirements)], capture_output=True, text=True
    )
    assert refused.returncode == 2 and "invalid choice: 'gpu'" in refused.stderr
    assert cuda_run.returncode == 1 and "FAIL base variant sagemaker" in cuda_run.stdout


def test_cuda_levers_are_applied_not_just_imported(cuda_run):
    """liger-kernel 0.8.5's patch (with the pinned transformers 5, both in the main venv with the Triton
    it imports) builds a tiny Llama with liger's RMSNorm and the NF4 round trip holds; flash-attn
    (CUDA-only, absent here) is reported by name. On the image all three must pass. A subprocess (the CUDA
    family's CLI run), as liger's patch rebinds transformers' Llama classes for the rest of the process."""
    assert "Traceback" not in cuda_run.stderr, cuda_run.stderr[-3000:]
    problems = [line.removeprefix("FAIL ") for line in cuda_run.stdout.splitlines() if " lever (" in line]
    assert len(problems) == 1, cuda_run.stdout
    assert problems[0].startswith("flash-attn lever (load_flash_attention): ModuleNotFoundError")
    assert "flash_attn_2_cuda" in problems[0]


def test_a_lever_that_raises_is_reported_with_its_error(verify_env):
    def broken():
        raise ImportError("liger-kernel needs transformers >= 5.0")

    problems = verify_env.lever_problems((("liger-kernel", broken), ("bitsandbytes", verify_env.quantize_4bit)))
    assert problems == ["liger-kernel lever (broken): ImportError: liger-kernel needs transformers >= 5.0"]
