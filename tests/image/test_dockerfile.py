"""The training image's Dockerfile: lint-clean, pinned base, one source of truth for versions."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from image_files import DOCKERFILE, PAYLOADS
from packaging.specifiers import SpecifierSet

BASE_IMAGE = "public.ecr.aws/neuron/pytorch-training-neuronx"
TAG = re.compile(r"^(?P<torch>\d+\.\d+\.\d+)-neuronx-py(?P<py>\d{3,})-sdk(?P<sdk>\d+\.\d+\.\d+)-ubuntu22\.04$")
# pip options that take a value; any other bare word after `pip install` is a retyped package spec.
PIP_VALUE_OPTIONS = {"-r", "--requirement", "--extra-index-url", "--index-url", "-i", "-c", "--constraint"}


def only(instructions, keyword):
    found = [arguments for name, arguments in instructions if name == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def from_image(instructions) -> tuple[str, str, str]:
    """(platform, image, tag) of the single FROM."""
    words = only(instructions, "FROM").split()
    platform = next((w.split("=", 1)[1] for w in words if w.startswith("--platform=")), "")
    image, _, tag = next(w for w in words if not w.startswith("--")).partition(":")
    return platform, image, tag


def pip_installs(instructions) -> list[list[str]]:
    """Token lists of every `pip install` command in RUN instructions (after the word install)."""
    commands = []
    for name, arguments in instructions:
        if name != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", arguments):
            tokens = shlex.split(command)
            if "pip" in " ".join(tokens[:3]) and "install" in tokens:
                commands.append(tokens[tokens.index("install") + 1 :])
    return commands


def copied_requirements_path(instructions) -> str:
    """Where the COPY puts requirements-cluster.txt inside the image."""
    for name, arguments in instructions:
        words = [w for w in arguments.split() if not w.startswith("--")]
        if name == "COPY" and "requirements-cluster.txt" in words[:-1]:
            return words[-1].rstrip("/") + "/requirements-cluster.txt"
    raise AssertionError("no COPY of requirements-cluster.txt")


def test_hadolint_clean():
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run([str(hadolint), str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_ignored_rule_is_justified(dockerfile_text):
    lines = dockerfile_text.splitlines()
    for number, line in enumerate(lines):
        if "hadolint ignore" in line:
            before = lines[number - 1].strip() if number else ""
            assert before.startswith("#") and "hadolint" not in before, (
                f"line {number + 1}: '{line.strip()}' needs a comment line above it saying why"
            )


def test_base_is_the_pinned_neuron_training_image(instructions):
    platform, image, tag = from_image(instructions)
    assert image == BASE_IMAGE
    assert platform == "linux/amd64"
    match = TAG.match(tag)
    assert match, f"tag {tag!r} is not a full Neuron DLC tag"
    assert match["sdk"] == "2.26.1"


def test_base_python_is_one_the_frozen_lane_declares(instructions):
    """The image's Python satisfies optimum-neuron's own Requires-Python, read from the frozen lane's site
    (.venv/trn1-site): the main stack's tests run on any Python from 3.11 to 3.13, the image on the one its
    lane installs on. CI runs `make test-trn1` on Python 3.11, the image's."""
    _, _, tag = from_image(instructions)
    digits = TAG.match(tag)["py"]
    site = Path(sys.prefix) / "trn1-site"
    found = [d for d in metadata.distributions(path=[str(site)]) if d.metadata["Name"] == "optimum-neuron"]
    assert len(found) == 1, f"{site} holds no optimum-neuron: run `make venv`"
    declared = SpecifierSet(found[0].metadata["Requires-Python"])
    assert f"{digits[0]}.{digits[1:]}" in declared, (tag, str(declared))


def test_base_torch_matches_the_torch_neuronx_pin(instructions, pins):
    # torch-neuronx versions start with the torch release they extend (2.8.0.2.10.x -> torch 2.8.0).
    _, _, tag = from_image(instructions)
    assert pins["torch-neuronx"].startswith(TAG.match(tag)["torch"] + ".")


def test_labels_name_the_sdk_line_and_base(instructions):
    _, image, tag = from_image(instructions)
    labels = dict(
        shlex.split(pair)[0].split("=", 1) for pair in re.findall(r'\S+="[^"]*"', only(instructions, "LABEL"))
    )
    assert labels["com.amazonaws.neuron.sdk.version"] == TAG.match(tag)["sdk"]
    assert labels["org.opencontainers.image.base.name"] == f"{image}:{tag}"


def test_installs_only_from_the_requirements_file(instructions):
    installs = pip_installs(instructions)
    assert len(installs) == 1, f"expected one pip install, found {installs}"
    tokens = installs[0]
    assert "--no-cache-dir" in tokens
    requirement_files = []
    for position, token in enumerate(tokens):
        previous = tokens[position - 1] if position else ""
        if previous in PIP_VALUE_OPTIONS:
            if previous in {"-r", "--requirement"}:
                requirement_files.append(token)
            continue
        assert token.startswith("-"), f"pip install names {token!r} directly; pin it in requirements-cluster.txt"
    assert requirement_files == [copied_requirements_path(instructions)]


def test_no_pinned_version_is_retyped(dockerfile_text, pins):
    retyped = {name: version for name, version in pins.items() if version in dockerfile_text}
    assert not retyped, f"versions belong in requirements-cluster.txt only: {retyped}"


def test_build_ends_with_the_smoke_check_against_the_same_file(instructions):
    last_name, last_arguments = instructions[-1]
    assert last_name == "RUN"
    check = shlex.split(last_arguments.split("&&")[0])
    assert check[:2] == [
        "python3",
        copied_requirements_path(instructions).replace("requirements-cluster.txt", "verify_env.py"),
    ]
    assert check[2:] == [copied_requirements_path(instructions)]


def test_copied_sources_exist(instructions):
    for name, arguments in instructions:
        if name == "COPY":
            for source in [w for w in arguments.split() if not w.startswith("--")][:-1]:
                assert (PAYLOADS / source).is_file(), f"COPY source {source} missing under payloads/"


def test_no_secrets_baked_in(instructions):
    secret_words = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|ACCESS_KEY|AKIA[0-9A-Z]{16}", re.I)
    for name, arguments in instructions:
        if name in {"ARG", "ENV", "LABEL", "RUN"}:
            assert not secret_words.search(arguments), f"{name} {arguments} looks like it carries a secret"
