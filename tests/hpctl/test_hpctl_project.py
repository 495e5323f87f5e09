import json

import pytest

from hpctl.common import project
from hpctl.common.errors import HpctlError
from hpctl.common.project import DEFAULT_STACK_NAME, resolve_settings


def write_cdk_json(folder, context):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cdk.json").write_text(json.dumps({"app": "python3 app.py", "context": context}))


def test_cdk_json_context_names_stack_and_region_from_a_subfolder(tmp_path):
    write_cdk_json(tmp_path, {"stack_name": "MyStack", "region": "eu-west-1"})
    (tmp_path / "docs").mkdir()
    settings = resolve_settings(stack=None, region=None, cwd=tmp_path / "docs")
    assert (settings.root, settings.stack_name, settings.region) == (tmp_path, "MyStack", "eu-west-1")


def test_command_line_wins_over_cdk_json(tmp_path):
    write_cdk_json(tmp_path, {"stack_name": "MyStack", "region": "eu-west-1"})
    settings = resolve_settings(stack="Other", region="us-east-1", cwd=tmp_path)
    assert (settings.stack_name, settings.region) == ("Other", "us-east-1")


def test_defaults_without_cdk_json_leave_the_region_to_boto3(tmp_path, monkeypatch):
    monkeypatch.setattr(project, "PACKAGE_CHECKOUT", tmp_path / "installed-from-a-wheel")  # no checkout either
    settings = resolve_settings(stack=None, region=None, cwd=tmp_path)
    assert (settings.root, settings.stack_name, settings.region) == (tmp_path, DEFAULT_STACK_NAME, None)


def test_cdk_json_without_those_keys_uses_the_defaults(tmp_path):
    write_cdk_json(tmp_path, {"instance_type": "ml.trn1.32xlarge"})
    settings = resolve_settings(stack=None, region=None, cwd=tmp_path)
    assert (settings.stack_name, settings.region) == (DEFAULT_STACK_NAME, None)


def test_broken_cdk_json_is_named(tmp_path):
    (tmp_path / "cdk.json").write_text("{not json")
    with pytest.raises(HpctlError, match=r"cdk.json is not valid JSON"):
        resolve_settings(stack=None, region=None, cwd=tmp_path)


def test_outside_any_checkout_the_one_hpctl_is_installed_from_serves(tmp_path, monkeypatch):
    """A run config's own folder (docs/custom-data.md) has no cdk.json: the checkout hpctl runs from is used."""
    checkout = tmp_path / "checkout"
    write_cdk_json(checkout, {"stack_name": "Installed", "region": "eu-west-3"})
    monkeypatch.setattr(project, "PACKAGE_CHECKOUT", checkout)
    (tmp_path / "my-data").mkdir()
    settings = resolve_settings(stack=None, region=None, cwd=tmp_path / "my-data")
    assert (settings.root, settings.stack_name, settings.region) == (checkout, "Installed", "eu-west-3")


def test_a_venv_without_hpctl_s_packages_gets_one_line_naming_the_install(tmp_path):
    """A venv made before hpctl's needs joined the rehearsal's install: one line names `make hpctl`."""
    import os
    import subprocess
    import sys

    (tmp_path / "boto3.py").write_text('raise ModuleNotFoundError("No module named \'boto3\'", name="boto3")\n')
    checkout = project.PACKAGE_CHECKOUT
    path = os.pathsep.join((str(tmp_path), str(checkout), str(checkout / "payloads")))
    done = subprocess.run(
        [sys.executable, "-m", "hpctl", "status"],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr == (
        f"error: hpctl needs the Python package boto3, which {sys.prefix} lacks: run `make hpctl` in {checkout} "
        "(requirements-hpctl.txt)\n"
    )
