"""The Trainium2 (TorchNeuron) image: lint-clean, versions only in requirements-trn2.txt and equal to the
main stack's where the two share a package, pip into one venv, the build ending in the family's check;
the stack builds it per Trainium2 partition and leaves the trn1 image's recipe as it was. Its base and
every Neuron version match the Neuron release it names, each from the source in SOURCES."""

from __future__ import annotations

import re
import shlex

import pytest
from image_files import GPU_REQUIREMENTS, TRN2_DOCKERFILE, TRN2_REQUIREMENTS, hadolint_findings, parse_dockerfile

from stacks.accelerators import NEURON, TORCHNEURON
from stacks.image import RECIPES

VENV_PYTHON = "/opt/venv/bin/python"

# What the image pins, the version, and the public source that states it (read 2026-11-27). Neuron 2.34.0
# (2026-11-30) ships torch-neuronx 2.13.3.1 (https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.34.0),
# but its compiler, NKI, runtime and collectives versions were in no source reachable on 2026-12-06: the set
# moves together, so it stays on 2.33.0 until they are (docs/versions.md).
RELEASE_CONTENT = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/release-notes/releasecontent.html"
TORCH_NEURONX_RELEASE = "https://github.com/aws-neuron/torch-neuronx/releases/tag/v2.33.0"
COMPONENTS = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/release-notes/components/index.html"
QUICKSTART = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.1/torch/get-started/quickstart-torch-neuron.html"
DLC_UPDATE = "https://awsdocs-neuron.readthedocs-hosted.com/en/v2.33.0/setup/pytorch/update-dlc.html"
DLC_DATA = "aws/deep-learning-containers docs/src/data/pytorch/2.13-cuda-ec2.yml (EFA of AWS's torch 2.13 images)"
SOURCES = {
    # item: (version, source)
    "base": (
        "public.ecr.aws/ubuntu/ubuntu:26.04",
        f"{TORCH_NEURONX_RELEASE} (wheels for Ubuntu 26.04 only); {QUICKSTART}",
    ),
    "python": (
        "3.14",
        f"{DLC_UPDATE} (2.33 DLC images: Ubuntu 26.04, Python 3.14); {TORCH_NEURONX_RELEASE} (3.12-3.14)",
    ),
    "torch-neuronx": ("2.13.3.0", f"{COMPONENTS} (TorchNeuron 2.14.3.0 and 2.13.3.0); {TORCH_NEURONX_RELEASE}"),
    "torch": ("2.13.0", f"{TORCH_NEURONX_RELEASE} (family 2.13.3.0.*: PyTorch 2.13.0)"),
    "neuronx-cc": ("2.28.7631.0", f"{RELEASE_CONTENT} (neuronx-cc-2.28.7631.0); {COMPONENTS}"),
    "nki": ("0.7.0", f"{RELEASE_CONTENT} (nki-0.7.0); {COMPONENTS}"),
    "aws-neuronx-runtime-lib": ("2.35.30.0", f"{RELEASE_CONTENT} (aws-neuronx-runtime-lib-2.35.30.0)"),
    "aws-neuronx-collectives": ("2.35.43.0", f"{RELEASE_CONTENT} (aws-neuronx-collectives-2.35.43.0)"),
    "aws-neuronx-dkms (host)": ("2.31.7.0", f"{RELEASE_CONTENT}; docs/trainium2.md (the node's driver)"),
    "aws-efa-installer": ("1.49.0", DLC_DATA),
}


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


def _arg(name: str) -> str:
    return next(a.split("=", 1)[1] for n, a in INSTRUCTIONS if n == "ARG" and a.startswith(f"{name}="))


def test_the_base_is_the_os_neuron_publishes_its_wheels_for():
    base = next(arguments for name, arguments in INSTRUCTIONS if name == "FROM").split()[-1]
    assert base == SOURCES["base"][0]
    assert f'org.opencontainers.image.base.name="{base}"' in TRN2_DOCKERFILE.read_text()


def test_the_image_names_torchneurons_compile_cache_and_the_chain_keeps_its_own():
    """graph-count reads TORCH_NEURONX_NEFF_CACHE_DIR: the image sets it; Pyxis lets an image's value win over
    the host's unless srun names it in --container-env, which container.sh does for every variable it lists."""
    from llm_pipeline import trn2_acceptance

    env = " ".join(arguments for name, arguments in INSTRUCTIONS if name == "ENV")
    assert f"{trn2_acceptance.NEFF_CACHE_VARIABLE}=/tmp/torchneuron-neff-cache" in env
    container = (TRN2_DOCKERFILE.parent / "slurm" / "container.sh").read_text()
    assert f"HPL_CONTAINER_ENV_NAMES=({trn2_acceptance.NEFF_CACHE_VARIABLE})" in container


def test_every_neuron_version_is_the_cited_releases(trn2_pins):
    for name in ("torch-neuronx", "torch", "neuronx-cc", "nki"):
        assert trn2_pins[name] == SOURCES[name][0], (name, SOURCES[name][1])
    assert _arg("NEURON_RUNTIME_VERSION") == SOURCES["aws-neuronx-runtime-lib"][0]
    assert _arg("NEURON_COLLECTIVES_VERSION") == SOURCES["aws-neuronx-collectives"][0]
    assert _arg("EFA_INSTALLER").endswith(f"/aws-efa-installer-{SOURCES['aws-efa-installer'][0]}.tar.gz")
    text = TRN2_DOCKERFILE.read_text()
    assert '"aws-neuronx-runtime-lib=${NEURON_RUNTIME_VERSION}*"' in text
    assert '"aws-neuronx-collectives=${NEURON_COLLECTIVES_VERSION}*"' in text
    assert "latest" not in text and not re.search(r"==\d+\.\*", text)  # no moving versions
