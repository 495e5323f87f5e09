"""Fixtures for the training-image tests."""

from __future__ import annotations

import pytest
from image_files import DOCKERFILE, REQUIREMENTS, load_verify_env, parse_dockerfile


@pytest.fixture(scope="session")
def dockerfile_text() -> str:
    return DOCKERFILE.read_text()


@pytest.fixture(scope="session")
def instructions(dockerfile_text) -> list[tuple[str, str]]:
    return parse_dockerfile(dockerfile_text)


@pytest.fixture(scope="session")
def verify_env():
    return load_verify_env()


@pytest.fixture(scope="session")
def pins(verify_env) -> dict[str, str]:
    return verify_env.read_pins(REQUIREMENTS)
