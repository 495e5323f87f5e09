"""Bad inputs stop on_init_complete.sh early, non-zero, with the step and the problem named."""

from __future__ import annotations

import json

import pytest
from lifecycle_node import COMPUTE_IPS, CONTROLLER_IP, FACTS, FakeNode


def assert_fails(run, step: str, *fragments: str) -> None:
    assert run.returncode != 0
    assert f"ERROR in step {step}:" in run.stderr, run.stderr
    for fragment in fragments:
        assert fragment in run.stderr, run.stderr


def test_missing_resource_config(node: FakeNode) -> None:
    node.resource_config_path.unlink()

    run = node.run(CONTROLLER_IP)

    assert_fails(run, "identify-node", f"HyperPod resource config not found: {node.resource_config_path}")
    assert not (node.root / "etc/profile.d").exists()


def test_malformed_resource_config(node: FakeNode) -> None:
    node.resource_config_path.write_text('{"InstanceGroups": [')

    run = node.run(CONTROLLER_IP)

    assert_fails(run, "identify-node", f"{node.resource_config_path} is not valid JSON", "line 1")


def test_resource_config_without_instance_groups(node: FakeNode) -> None:
    node.resource_config_path.write_text('{"ClusterConfig": {}}')

    assert_fails(node.run(CONTROLLER_IP), "identify-node", "has no InstanceGroups list")


def test_resource_config_path_from_environment(node: FakeNode) -> None:
    moved = node.base / "elsewhere.json"
    node.resource_config_path.rename(moved)

    run = node.run(CONTROLLER_IP, SAGEMAKER_RESOURCE_CONFIG_PATH=str(moved))

    assert run.returncode == 0, run.stderr


def test_node_address_absent_from_resource_config(node: FakeNode) -> None:
    run = node.run("10.9.9.9 172.17.0.1")

    assert_fails(run, "identify-node", "none of this node's addresses (10.9.9.9 172.17.0.1) is a CustomerIpAddress")


def test_node_in_a_group_the_facts_do_not_know(node: FakeNode) -> None:
    config = json.loads(node.resource_config_path.read_text())
    config["InstanceGroups"][2]["Name"] = "trn2"
    node.resource_config_path.write_text(json.dumps(config))

    run = node.run(COMPUTE_IPS[0])

    assert_fails(run, "identify-node", "instance group 'trn2' is none of the groups", "trn1 (Compute)")


def test_missing_facts_file(node: FakeNode) -> None:
    (node.scripts / "cluster-facts.json").unlink()

    run = node.run(CONTROLLER_IP)

    assert_fails(run, "read-facts", f"cluster facts file not found: {node.scripts / 'cluster-facts.json'}")


def test_facts_file_lacking_keys(node: FakeNode) -> None:
    facts = {key: value for key, value in FACTS.items() if key not in ("outputs_dir", "runtime")}
    (node.scripts / "cluster-facts.json").write_text(json.dumps(facts))

    assert_fails(node.run(CONTROLLER_IP), "read-facts", "lacks keys outputs_dir, runtime", "redeploy")


@pytest.mark.parametrize("value", [["a"], None, True])
def test_facts_value_that_is_not_a_scalar(node: FakeNode, value) -> None:
    (node.scripts / "cluster-facts.json").write_text(json.dumps({**FACTS, "partition": value}))

    assert_fails(node.run(CONTROLLER_IP), "read-facts", "partition must be a string or an integer")


def test_fsx_never_mounted_gives_up_after_the_timeout(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP, mounted=False, LIFECYCLE_FSX_TIMEOUT="2", LIFECYCLE_FSX_POLL="1")

    assert_fails(run, "wait-fsx", "/fsx is not mounted after 2s", "security group")
    assert "waiting for /fsx to be mounted and writable" in run.stdout
    assert not (node.fsx / "outputs").exists()


def test_default_user_missing(node: FakeNode) -> None:
    run = node.run(CONTROLLER_IP, user="someone")

    assert_fails(run, "fsx-layout", "default user ubuntu does not exist on this node")


def test_compute_node_without_neuron_devices(node: FakeNode) -> None:
    run = node.run(COMPUTE_IPS[0])

    assert_fails(run, "neuron-devices", "no /dev/neuron* devices on this ml.trn1.32xlarge node")


def test_compute_node_without_enroot_for_the_pyxis_runtime(node: FakeNode) -> None:
    node.add_neuron_devices()
    node.remove_recorder("enroot")

    assert_fails(node.run(COMPUTE_IPS[0]), "enroot-devices", "runtime is pyxis but enroot is not installed")


def test_failing_command_names_its_step(node: FakeNode) -> None:
    (node.root / "etc").mkdir(exist_ok=True)
    (node.root / "etc/profile.d").write_text("a file where a folder belongs")

    run = node.run(CONTROLLER_IP)

    assert_fails(run, "write-profile", "command failed", "mkdir -p")


def test_a_file_where_the_layout_needs_a_folder_is_named(node: FakeNode) -> None:
    (node.fsx / "models").write_text("a file where a folder belongs")

    run = node.run(CONTROLLER_IP)

    assert_fails(run, "fsx-layout", "/fsx/models is not a folder: move it away")
