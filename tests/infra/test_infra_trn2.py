"""A Trainium2 compute group (TorchNeuron) in us-east-2, where cfn-lint's data lists ml.trn2.48xlarge for
HyperPod: the app synthesizes lint- and nag-clean, builds the Trainium2 image for that partition from
payloads/Dockerfile.trn2 beside the untouched trn1 image, and gives the partition its facts."""

from __future__ import annotations

import json

import aws_cdk as cdk
import pytest
from test_infra_lint_nag import nag_report, template_path

from llm_pipeline.jobs.launch import LaunchError
from stacks.accelerators import INSTANCE_TYPES, NEURON, TORCHNEURON, TRAINIUM2_CHIP_BF16_TFLOPS
from stacks.build import REPO_ROOT
from stacks.config import cluster_facts
from stacks.image import lane_images
from stacks.lint import lint_template

pytestmark = pytest.mark.xdist_group("infra")


def test_trn2_facts_come_from_the_accelerator_table():
    facts = INSTANCE_TYPES["ml.trn2.48xlarge"]
    assert (facts.devices, facts.efa_interfaces, facts.image_family) == (64, 16, TORCHNEURON)
    assert round(facts.peak_bf16_tflops / 1000, 1) == 10.7  # 10.7 PF dense bf16 per node (Neuron arch page)
    assert facts.peak_tflops_per_device == 16 * TRAINIUM2_CHIP_BF16_TFLOPS / 64


def test_cfn_lint_and_cdk_nag_find_nothing(trn2_synth):
    matches = lint_template(template_path(trn2_synth), ["us-east-2"])
    assert [f"{m.rule.id} {m.message} {m.path}" for m in matches] == []
    report = nag_report(trn2_synth)
    assert report["conclusion"] == "success" and report["violations"] == []


def test_each_trainium_generation_gets_its_own_image(trn2_synth):
    dockerfiles = sorted(
        image["source"].get("dockerFile", "Dockerfile") for image in trn2_synth.training_images().values()
    )
    assert dockerfiles == ["Dockerfile", "Dockerfile.trn2"]
    assert trn2_synth.config.image_families == ("neuron", TORCHNEURON)


def test_the_jobs_lane_builds_no_trainium2_image():
    """hpctl job submit refuses trn2 (tests/hpctl/test_hpctl_job.py): the jobs lane has no image to build for it."""
    stack = cdk.Stack(cdk.App(), "Images")
    images = lane_images(
        stack, context_dir=REPO_ROOT / "payloads", families=(NEURON, TORCHNEURON), lanes=("cluster", "jobs")
    )
    assert {lane: sorted(found) for lane, found in images.items()} == {
        "cluster": [NEURON, TORCHNEURON],
        "jobs": [NEURON],
    }
    assert images["jobs"][NEURON] is images["cluster"][NEURON]  # built once for both lanes


def test_the_trn2_partition_names_its_runtime_and_mfu_peak(trn2_synth):
    images = {"neuron": "repo:trn1", TORCHNEURON: "repo:trn2"}
    partitions = cluster_facts(trn2_synth.config, image_uris=images)["partitions"]
    assert (partitions["trn2"]["image_uri"], partitions["trn2"]["image_family"]) == ("repo:trn2", TORCHNEURON)
    assert partitions["trn2"]["peak_tflops"] == INSTANCE_TYPES["ml.trn2.48xlarge"].peak_tflops_per_device
    assert (partitions["trn1"]["image_uri"], partitions["trn1"]["image_family"]) == ("repo:trn1", "neuron")
    assert partitions["trn1"]["peak_tflops"] == 0.0  # the payload's own table, or no MFU
    # prepare's check of a full fine-tuning load reads the node's memory from the same table
    assert partitions["trn2"]["host_memory_gib"] == INSTANCE_TYPES["ml.trn2.48xlarge"].host_memory_gib == 2048


def test_the_acceptance_launches_its_own_shape_inside_salloc_n_2(trn2_synth, tmp_path):
    """docs/trainium2.md runs the acceptance inside `salloc -N 2`: the allocation's SLURM_* describe two nodes
    and no submit chain set HPL_DEVICES_PER_NODE. The one-node checks still ask for one node, the two-node one
    for two, each with the trn2.48xlarge's 64 ranks a node, read from the deploy's facts (stacks/accelerators.py
    -> cluster facts -> deploy-facts.json), not from the chain's environment."""
    from llm_pipeline.jobs import acceptance_launch
    from llm_pipeline.jobs.deploy_facts import DEPLOY_FACTS_FILE
    from stacks.payloads import deploy_facts

    images = {"neuron": "repo:trn1", TORCHNEURON: "repo:trn2"}
    facts = deploy_facts(cluster_facts(trn2_synth.config, image_uris=images))
    (tmp_path / DEPLOY_FACTS_FILE).write_text(json.dumps(facts))
    salloc = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "trn2-st-1-[1-2]",
        "SLURM_JOB_PARTITION": "trn2",
        "HPL_DEVICES_PER_NODE": "1",  # a stale chain value must not count
    }
    one = acceptance_launch.torchrun(salloc, tmp_path, nodes=1, python="python3")
    assert one[0] == "python3" and "srun" not in one
    assert [a for a in one if a.startswith(("--nnodes", "--nproc_per_node"))] == ["--nnodes=1", "--nproc_per_node=64"]
    two = acceptance_launch.torchrun(salloc, tmp_path, nodes=2, python="python3")
    assert two[: two.index("python3")] == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=trn2-st-1-1,trn2-st-1-2",
    ]
    assert [a for a in two if a.startswith(("--nnodes", "--nproc_per_node"))] == ["--nnodes=2", "--nproc_per_node=64"]
    assert "--rdzv_endpoint=trn2-st-1-1:" + str(20000 + (4242 + 2) % 12000) in two
    with pytest.raises(LaunchError, match=r"needs a 2-node Slurm allocation \(salloc -N 2"):
        acceptance_launch.torchrun({**salloc, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1"}, tmp_path, nodes=2)
    with pytest.raises(LaunchError, match="SLURM_JOB_PARTITION='trn1-typo' is not a deployed partition"):
        acceptance_launch.torchrun({**salloc, "SLURM_JOB_PARTITION": "trn1-typo"}, tmp_path, nodes=1)
