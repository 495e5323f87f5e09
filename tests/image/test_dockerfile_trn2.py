"""The Trainium2 (TorchNeuron) image: lint-clean, versions only in requirements-trn2.txt and equal to the
main stack's where the two share a package, pip into one venv, the build ending in the family's check;
the stack builds it per Trainium2 partition and leaves the trn1 image's recipe as it was."""

from __future__ import annotations

import shlex

import pytest
from image_files import GPU_REQUIREMENTS, TRN2_DOCKERFILE, TRN2_REQUIREMENTS, hadolint_findings, parse_dockerfile

from stacks.accelerators import NEURON, TORCHNEURON
from stacks.image import RECIPES

VENV_PYTHON = "/opt/venv/bin/python"


INSTRUCTIONS = parse_dockerfile(TRN2_DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def trn2_pins(verify_env) -> dict[str, str]:
    return verify_env.read_pins(TRN2_REQUIREMENTS)


def test_hadolint_clean():
    assert hadolint_findings(TRN2_DOCKERFILE) == ""


def test_shared_pins_are_the_main_stacks(trn2_pins, verify_env):
    gpu = verify_env.read_pins(GPU_REQUIREMENTS)
    shared = trn2_pins.keys() & gpu.keys()
    assert {"transformers", "trl", "peft", "accelerate", "datasets", "torch"} <= shared
    assert {name: (trn2_pins[name], gpu[name]) for name in shared if trn2_pins[name] != gpu[name]} == {}
    assert trn2_pins["torch-neuronx"].startswith(gpu["torch"].rsplit(".", 1)[0])  # TorchNeuron for that torch
    assert "torch-xla" not in trn2_pins and "optimum-neuron" not in trn2_pins


def test_pins_install_into_the_venv_from_the_file(trn2_pins):
    runs = [arguments for name, arguments in INSTRUCTIONS if name == "RUN"]
    installs = [shlex.split(command) for run in runs for command in run.split("&&") if "pip install" in command]
    from_file = [install for install in installs if "-r" in install]
    assert len(from_file) == 1 and from_file[0][:4] == [VENV_PYTHON, "-m", "pip", "install"]
    assert from_file[0][from_file[0].index("-r") + 1] == "/opt/hyperpod-lora/requirements-trn2.txt"
    text = TRN2_DOCKERFILE.read_text()
    assert not {name: version for name, version in trn2_pins.items() if f"=={version}" in text}


def test_build_ends_with_the_torchneuron_check_against_the_same_file():
    name, arguments = INSTRUCTIONS[-1]
    assert name == "RUN"
    assert shlex.split(arguments.split("&&")[0]) == [
        "python3",
        "/opt/hyperpod-lora/verify_env.py",
        "--family",
        "torchneuron",
        "/opt/hyperpod-lora/requirements-trn2.txt",
    ]


def test_the_torchneuron_check_refuses_torch_xla(verify_env, monkeypatch):
    assert verify_env.absent_problems("torchneuron") == []  # no torch_xla here
    real = verify_env.importlib.util.find_spec
    monkeypatch.setattr(
        verify_env.importlib.util, "find_spec", lambda name: object() if name == "torch_xla" else real(name)
    )
    (problem,) = verify_env.absent_problems("torchneuron")
    assert problem.startswith("torch_xla: installed")
    assert verify_env.absent_problems("neuron") == []  # the trn1 image is torch-xla's


def test_the_stack_builds_it_for_trainium2_and_keeps_the_trn1_recipe():
    assert RECIPES[TORCHNEURON].dockerfile == TRN2_DOCKERFILE.name
    assert RECIPES[TORCHNEURON].requirements == TRN2_REQUIREMENTS.name
    assert (RECIPES[NEURON].dockerfile, RECIPES[NEURON].requirements) == ("Dockerfile", "requirements-cluster.txt")
