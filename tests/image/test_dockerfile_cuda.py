"""The CUDA training image's Dockerfile and pins: lint-clean, a pinned public base per variant confirmed
in docs/image.md, versions only in requirements-gpu.txt (and the local environments at each lane's
pins), pip into the base's venv, and the build ending in the family's check."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from image_files import CUDA_DOCKERFILE, GPU_REQUIREMENTS, PAYLOADS, REQUIREMENTS, parse_dockerfile
from packaging.utils import canonicalize_name

from llm_pipeline.training.torch.parallel import ACCELERATE_KEEPS_4BIT
from stacks.accelerators import CUDA
from stacks.image import CLUSTER_VARIANT, DLC_VARIANTS, JOB_VARIANT, RECIPES, VARIANT_BUILD_ARG

DOCS_IMAGE = PAYLOADS.parent / "docs" / "image.md"
BASE_IMAGE = "public.ecr.aws/deep-learning-containers/pytorch"
# AWS's amzn2023 line: the ec2 variant is the plain tag, the sagemaker variant adds a suffix.
TAG = re.compile(r"^(?P<torch>\d+\.\d+\.\d+)-cu(?P<cuda>\d{3})-amzn2023(?P<suffix>(-\w+)?)$")
TAG_SUFFIX = {"ec2": "", "sagemaker": "-sagemaker"}
# The build argument as the final FROM reads it, and the stage each variant's base is named by.
VARIANT_REFERENCE = f"${{{VARIANT_BUILD_ARG}}}"
BASE_STAGE = "base-{variant}"
VENV_PYTHON = "/opt/venv/bin/python"  # the base's uv-managed venv, first on its PATH
REPO = PAYLOADS.parent
# Requirement lines of a pins file (comments, blank lines and -r/-c options dropped).
PIN_LINE = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)(\[[^\]]*\])?==(?P<version>\S+)$")


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    return parse_dockerfile(CUDA_DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def gpu_pins(verify_env) -> dict[str, str]:
    return verify_env.read_pins(GPU_REQUIREMENTS)


def stages(instructions) -> list[tuple[str, str, str, str]]:
    """(platform, image, tag, stage name) of every FROM, in order."""
    found = []
    for name, arguments in instructions:
        if name != "FROM":
            continue
        words = arguments.split()
        platform = next((w.split("=", 1)[1] for w in words if w.startswith("--platform=")), "")
        plain = [w for w in words if not w.startswith("--")]
        image, _, tag = plain[0].partition(":")
        found.append((platform, image, tag, plain[2] if len(plain) == 3 and plain[1].upper() == "AS" else ""))
    return found


def base_tags(instructions) -> dict[str, str]:
    """variant -> the full tag its base stage pulls."""
    by_stage = {stage: (image, tag) for _, image, tag, stage in stages(instructions) if stage}
    tags = {}
    for variant in DLC_VARIANTS:
        image, tag = by_stage[BASE_STAGE.format(variant=variant)]
        assert image == BASE_IMAGE
        tags[variant] = tag
    return tags


def loose_pins(path: Path) -> dict[str, str]:
    """name -> version of every `name==version` line in a pip requirements file (others ignored)."""
    pins = {}
    for raw in path.read_text().splitlines():
        match = PIN_LINE.match(raw.split("#", 1)[0].strip())
        if match:
            pins[canonicalize_name(match["name"])] = match["version"]
    return pins


def disagreements(ours: dict[str, str], reference: dict[str, str]) -> dict[str, tuple[str, str]]:
    return {
        name: (ours[name], reference[name]) for name in ours.keys() & reference.keys() if ours[name] != reference[name]
    }


def test_hadolint_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(CUDA_DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_variant_has_a_base_stage_at_a_full_public_tag(instructions):
    """Both bases are the amd64 images of one release, named by full tags (never the short `2.13-` ones)."""
    tags = base_tags(instructions)
    for platform, image, _, stage in stages(instructions)[:-1]:
        assert (platform, image) == ("linux/amd64", BASE_IMAGE), stage
    releases = set()
    for variant, tag in tags.items():
        match = TAG.match(tag)
        assert match, f"tag {tag!r} is not a full, pinned DLC tag"
        assert match["suffix"] == TAG_SUFFIX[variant]
        releases.add((match["torch"], match["cuda"]))
    (release,) = releases  # both variants of one release
    assert release[1] == "133"


def test_the_final_stage_is_the_variants_base(instructions):
    """Declared before the first FROM (the only place FROM can read it) with the ec2 default, so a plain
    build gives the cluster lane's image; declared again after the last FROM for the labels and the check."""
    first_name, first_arguments = instructions[0]
    assert (first_name, first_arguments) == ("ARG", f"{VARIANT_BUILD_ARG}={CLUSTER_VARIANT}")
    assert (
        RECIPES[CUDA].variants == DLC_VARIANTS == ("ec2", "sagemaker") and RECIPES[CUDA].variants[0] == CLUSTER_VARIANT
    )
    assert JOB_VARIANT == "sagemaker"
    *_, final = stages(instructions)
    assert final == ("", BASE_STAGE.format(variant=VARIANT_REFERENCE), "", "")  # platform: the base stage's
    last_from = max(i for i, (name, _) in enumerate(instructions) if name == "FROM")
    assert ("ARG", VARIANT_BUILD_ARG) in instructions[last_from + 1 :]


def test_each_base_stage_labels_the_tag_it_pulls(instructions):
    """The final stage inherits its base stage's label, so the image says which base it was built on."""
    current = None
    labelled = {}
    for name, arguments in instructions:
        if name == "FROM":
            current = stages([(name, arguments)])[0]
        elif name == "LABEL" and current[3]:
            labelled[current[3]] = arguments
    for variant, tag in base_tags(instructions).items():
        assert labelled[BASE_STAGE.format(variant=variant)] == (
            f'org.opencontainers.image.base.name="{BASE_IMAGE}:{tag}"'
        )


def test_the_base_image_torch_is_the_pinned_torch(instructions, gpu_pins):
    """pip keeps the base's CUDA torch (and the flash-attn and torchvision built against it) only when
    the pin is that version; another pin reinstalls torch under them."""
    for tag in base_tags(instructions).values():
        assert gpu_pins["torch"] == TAG.match(tag)["torch"]
    assert "flash-attn" in gpu_pins  # the base's build, held to its version at build time


def test_docs_name_each_variants_tag_and_where_it_was_confirmed(instructions):
    docs = DOCS_IMAGE.read_text()
    assert "aws/deep-learning-containers" in docs and "Python 3.12" in docs and "CUDA 13.3" in docs
    tags = base_tags(instructions)
    short = ".".join(TAG.match(tags[CLUSTER_VARIANT])["torch"].split(".")[:2])  # the data file's version
    for variant, tag in tags.items():
        assert f"{BASE_IMAGE}:{tag}" in docs
        assert f"docs/src/data/pytorch/{short}-cuda-{variant}.yml" in docs


def test_installs_only_from_the_gpu_requirements_file_into_the_base_venv(instructions):
    runs = [arguments for name, arguments in instructions if name == "RUN"]
    installs = [shlex.split(command) for run in runs for command in run.split("&&") if "pip install" in command]
    assert len(installs) == 1
    (install,) = installs
    assert install[:4] == [VENV_PYTHON, "-m", "pip", "install"], "pins must land in the venv the base runs"
    tokens = install[4:]
    assert "--no-cache-dir" in tokens and tokens[tokens.index("-r") + 1] == "/opt/hyperpod-lora/requirements-gpu.txt"
    options_with_values = {"-r", "--extra-index-url"}
    for position, token in enumerate(tokens):
        if tokens[position - 1] not in options_with_values:
            assert token.startswith("-"), f"pip install names {token!r} directly; pin it in requirements-gpu.txt"


def test_no_pinned_version_is_retyped(instructions, gpu_pins):
    text = CUDA_DOCKERFILE.read_text()
    for tag in base_tags(instructions).values():
        text = text.replace(tag, "")
    retyped = {name: v for name, v in gpu_pins.items() if v in text}
    assert not retyped, f"versions belong in requirements-gpu.txt only: {retyped}"


def test_build_ends_with_the_cuda_check_against_the_same_file(instructions):
    """`python3` from PATH on purpose: the check proves the interpreter the steps start holds the pins."""
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


def test_gpu_pins_cover_the_stack(gpu_pins):
    for name in ("torch", "torchao", "torchtitan", "bitsandbytes", "liger-kernel", "flash-attn", "accelerate"):
        assert name in gpu_pins, f"{name} missing from requirements-gpu.txt"
    for name in ("transformers", "trl", "peft", "datasets", "safetensors", "huggingface-hub", "tokenizers"):
        assert name in gpu_pins, f"{name} missing from requirements-gpu.txt"
    assert gpu_pins["torchtitan"] == "0.2.2"  # the frozen ladder lane
    # an accelerate that keeps a 4-bit base as loaded under FSDP2 (the engine refuses older ones for qlora)
    assert tuple(map(int, gpu_pins["accelerate"].split(".")[:2])) >= ACCELERATE_KEEPS_4BIT


def test_the_local_environments_install_each_lanes_pins(gpu_pins, verify_env):
    """The tests run what each image runs: the main venv the CUDA image's versions (and the main stack in
    full), .venv/torchtitan-site the ladder's, .venv/trn1-site the frozen Neuron image's."""
    dev = loose_pins(REPO / "requirements-rehearse.txt") | loose_pins(REPO / "requirements-dev.txt")
    assert not disagreements(dev, gpu_pins)
    main_stack = ("torch", "transformers", "tokenizers", "trl", "peft", "accelerate", "datasets", "huggingface-hub")
    assert {name: dev.get(name) for name in (*main_stack, "safetensors", "liger-kernel")} == {
        name: gpu_pins[name] for name in (*main_stack, "safetensors", "liger-kernel")
    }
    torchtitan_site = loose_pins(REPO / "requirements-torchtitan-cpu.txt")
    assert not disagreements(torchtitan_site, gpu_pins) and {"torchtitan", "torchao"} <= set(torchtitan_site)
    trn1_site = loose_pins(REPO / "requirements-trn1-cpu.txt")
    cluster = verify_env.read_pins(REQUIREMENTS)
    assert not disagreements(trn1_site, cluster)
    assert {"optimum-neuron", "transformers", "trl", "peft", "accelerate"} <= set(trn1_site)
    # bitsandbytes is installed apart (its CPU backend for the QLoRA tests), at the image's pin.
    (makefile_pin,) = re.findall(r"bitsandbytes==(\S+)", (REPO / "Makefile").read_text())
    assert makefile_pin == gpu_pins["bitsandbytes"]


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
