"""The CUDA training image's Dockerfile and pins: lint-clean, a pinned public base confirmed in
docs/image.md, versions only in requirements-gpu.txt, and the build ending in the family's check."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from image_files import CUDA_DOCKERFILE, GPU_REQUIREMENTS, PAYLOADS, REQUIREMENTS, parse_dockerfile

from llm_pipeline.training.torch.parallel import ACCELERATE_KEEPS_4BIT
from stacks.accelerators import CUDA
from stacks.image import CLUSTER_VARIANT, DLC_VARIANTS, JOB_VARIANT, RECIPES, VARIANT_BUILD_ARG

DOCS_IMAGE = PAYLOADS.parent / "docs" / "image.md"
BASE_IMAGE = "public.ecr.aws/deep-learning-containers/pytorch-training"
# The tag as written, its variant left to the build argument, and each tag it resolves to.
VARIANT_REFERENCE = f"${{{VARIANT_BUILD_ARG}}}"
TAG = re.compile(
    r"^(?P<torch>\d+\.\d+\.\d+)-gpu-py(?P<py>\d{3,})-cu(?P<cuda>\d{3})-ubuntu22\.04-"
    + re.escape(VARIANT_REFERENCE)
    + "$"
)
FULL_TAG = re.compile(
    r"^(?P<torch>\d+\.\d+\.\d+)-gpu-py(?P<py>\d{3,})-cu(?P<cuda>\d{3})-ubuntu22\.04-(?P<variant>\w+)$"
)
# The fine-tuning stack both lanes share: the GPU lane trains, saves and merges with the same code.
SHARED_WITH_NEURON = ("transformers", "trl", "peft", "datasets", "safetensors", "huggingface-hub")
# Where the GPU lane moves ahead; the torch engine's CPU tests install the same versions (gpu-site).
GPU_AHEAD = PAYLOADS.parent / "requirements-gpu-cpu.txt"


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return parse_dockerfile(CUDA_DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def gpu_pins(verify_env) -> dict[str, str]:
    return verify_env.read_pins(GPU_REQUIREMENTS)


def from_image(instructions) -> tuple[str, str, str]:
    (words,) = [arguments.split() for name, arguments in instructions if name == "FROM"]
    platform = next(w.split("=", 1)[1] for w in words if w.startswith("--platform="))
    image, _, tag = next(w for w in words if not w.startswith("--")).partition(":")
    return platform, image, tag


def test_hadolint_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(CUDA_DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_base_is_aws_public_pytorch_training_image_at_a_full_tag(instructions):
    platform, image, tag = from_image(instructions)
    assert (platform, image) == ("linux/amd64", BASE_IMAGE)
    match = TAG.match(tag)
    assert match, f"tag {tag!r} is not a full, pinned DLC tag"
    assert match["cuda"] == "130" and match["py"] == "313"


def test_the_base_image_torch_is_the_pinned_torch(instructions, gpu_pins):
    """pip keeps the base's CUDA torch (and the flash-attn and torchvision built against it) only when
    the pin is that version; another pin reinstalls torch under them."""
    _, _, tag = from_image(instructions)
    assert gpu_pins["torch"] == TAG.match(tag)["torch"]
    assert "flash-attn" in gpu_pins  # the base's build, held to its version at build time


def test_docs_name_each_variants_tag_and_where_it_was_confirmed(instructions):
    _, image, tag = from_image(instructions)
    docs = DOCS_IMAGE.read_text()
    assert "aws/deep-learning-containers" in docs
    for variant in DLC_VARIANTS:
        assert f"{image}:{tag.replace(VARIANT_REFERENCE, variant)}" in docs
        assert f"docs/src/data/pytorch-training/2.10-gpu-{variant}.yml" in docs


def test_the_variant_is_a_build_argument_whose_default_is_the_cluster_image(instructions):
    """Declared before FROM (the only place FROM can read it) with the ec2 default, so a plain build
    gives the cluster lane's image; declared again after FROM, so the label names the same base."""
    first_name, first_arguments = instructions[0]
    assert (first_name, first_arguments) == ("ARG", f"{VARIANT_BUILD_ARG}={CLUSTER_VARIANT}")
    assert (
        RECIPES[CUDA].variants == DLC_VARIANTS == ("ec2", "sagemaker") and RECIPES[CUDA].variants[0] == CLUSTER_VARIANT
    )
    assert JOB_VARIANT == "sagemaker"
    from_at = next(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    assert ("ARG", VARIANT_BUILD_ARG) in instructions[from_at + 1 :]
    _, image, tag = from_image(instructions)
    (label,) = [arguments for name, arguments in instructions if name == "LABEL"]
    assert f'org.opencontainers.image.base.name="{image}:{tag}"' in label
    for variant in DLC_VARIANTS:  # each value resolves to a full, pinned tag of that variant
        resolved = FULL_TAG.match(tag.replace(VARIANT_REFERENCE, variant))
        assert resolved and resolved["variant"] == variant


def test_installs_only_from_the_gpu_requirements_file(instructions):
    runs = [arguments for name, arguments in instructions if name == "RUN"]
    installs = [shlex.split(command) for run in runs for command in run.split("&&") if "pip install" in command]
    assert len(installs) == 1
    tokens = installs[0][installs[0].index("install") + 1 :]
    assert "--no-cache-dir" in tokens and tokens[tokens.index("-r") + 1] == "/opt/hyperpod-lora/requirements-gpu.txt"
    options_with_values = {"-r", "--extra-index-url"}
    for position, token in enumerate(tokens):
        if tokens[position - 1] not in options_with_values:
            assert token.startswith("-"), f"pip install names {token!r} directly; pin it in requirements-gpu.txt"


def test_no_pinned_version_is_retyped(gpu_pins):
    text = CUDA_DOCKERFILE.read_text()
    _, _, tag = from_image(parse_dockerfile(text))
    retyped = {name: v for name, v in gpu_pins.items() if v in text.replace(tag, "")}
    assert not retyped, f"versions belong in requirements-gpu.txt only: {retyped}"


def test_build_ends_with_the_cuda_check_against_the_same_file(instructions):
    name, arguments = instructions[-1]
    assert name == "RUN"
    assert shlex.split(arguments.split("&&")[0]) == [
        "python3",
        "/opt/hyperpod-lora/verify_env.py",
        "--family",
        "cuda",
        "--variant",
        VARIANT_REFERENCE,  # the build argument: the check knows which base the tag named
        "/opt/hyperpod-lora/requirements-gpu.txt",
    ]


def test_gpu_pins_cover_the_stack_and_match_the_neuron_lane_where_shared(verify_env, gpu_pins):
    for name in ("torch", "torchao", "torchtitan", "bitsandbytes", "liger-kernel", "flash-attn", "accelerate"):
        assert name in gpu_pins, f"{name} missing from requirements-gpu.txt"
    for name in SHARED_WITH_NEURON:
        assert name in gpu_pins, f"{name} missing from requirements-gpu.txt"
    assert gpu_pins["torchtitan"] == "0.2.2"
    neuron = verify_env.read_pins(REQUIREMENTS)
    assert {n: gpu_pins[n] for n in SHARED_WITH_NEURON} == {n: neuron[n] for n in SHARED_WITH_NEURON}


def test_cuda_check_imports_what_the_gpu_lane_uses(verify_env, gpu_pins):
    wanted = dict(verify_env.CUDA_IMPORTS)
    assert {"torch", "torchao.float8", "torchtitan", "trl", "peft", "bitsandbytes", "liger_kernel.transformers"} <= set(
        wanted
    )
    # Every checked module's distribution is pinned (import name -> distribution name).
    distributions = {module.split(".")[0].replace("_", "-") for module in wanted}
    assert distributions <= set(gpu_pins)
    # The names the check asks for exist in the pinned libraries installed here (same versions).
    present = [(module, names) for module, names in verify_env.CUDA_IMPORTS if module in ("trl", "peft")]
    assert verify_env.import_problems(tuple(present)) == []


def test_the_torch_engine_tests_install_the_gpu_pins_that_move_ahead(verify_env, gpu_pins):
    ahead = verify_env.read_pins(GPU_AHEAD)
    neuron = verify_env.read_pins(REQUIREMENTS)
    assert ahead == {name: gpu_pins[name] for name in ahead}
    assert all(neuron[name] != version for name, version in ahead.items() if name in neuron)
    # an accelerate that keeps a 4-bit base as loaded under FSDP2 (the engine refuses older ones for qlora)
    assert tuple(map(int, ahead["accelerate"].split(".")[:2])) >= ACCELERATE_KEEPS_4BIT
