"""A Trainium2 compute group (TorchNeuron) in us-east-2, where cfn-lint's data lists ml.trn2.48xlarge for
HyperPod: the app synthesizes lint- and nag-clean, builds the Trainium2 image for that partition from
payloads/Dockerfile.trn2 beside the untouched trn1 image, and gives the partition its facts."""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def test_the_acceptance_gives_srun_the_image_and_the_chains_variables_for_one_node_and_two(trn2_synth, tmp_path):
    """docs/trainium2.md starts the acceptance on the host inside `salloc -N 2`; under Pyxis only srun's options
    put a level in the image. Each level's exact argv and environment against the table: the image, mounts and
    kept variables from slurm/container.sh, the EFA and Neuron variables from slurm/accelerator_env.sh (the
    files every chain step uses), 64 ranks a node from the deploy's facts (stacks/accelerators.py -> cluster
    facts -> deploy-facts.json), never the chain's HPL_DEVICES_PER_NODE."""
    from llm_pipeline.jobs import acceptance_launch
    from llm_pipeline.jobs.deploy_facts import DEPLOY_FACTS_FILE
    from stacks.payloads import deploy_facts

    images = {"neuron": "repo:trn1", TORCHNEURON: "123.dkr.ecr.us-east-2.amazonaws.com/trn2:abc"}
    facts = deploy_facts(cluster_facts(trn2_synth.config, image_uris=images))
    (tmp_path / DEPLOY_FACTS_FILE).write_text(json.dumps(facts))
    salloc = {
        "PATH": os.environ["PATH"],
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "trn2-st-1-[1-2]",
        "SLURM_JOB_PARTITION": "trn2",
        "HPL_DEVICES_PER_NODE": "1",  # a stale chain value must not count
        "HPL_FSX_MOUNT_PATH": "/fsx",
        "HPL_IMAGES_DIR": "/fsx/images",
        "HPL_COMPILE_CACHE_DIR": "/fsx/neuron-cache",
    }
    report, tiny, lora = Path("/fsx/outputs/acc"), Path("/fsx/tiny.toml"), Path("/fsx/lora.toml")
    levels = acceptance_launch.level_commands(salloc, tmp_path, report=report, tiny_config=tiny, lora_config=lora)
    container = [
        "--container-image=/fsx/images/trn2_abc.sqsh",
        "--container-mounts=/fsx:/fsx",
        f"--container-workdir={tmp_path}",
        "--container-env=TORCH_NEURONX_NEFF_CACHE_DIR",  # else the image's own cache folder wins
    ]
    pair = ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=trn2-st-1-1,trn2-st-1-2"]
    launch = ["python3", "-m", "llm_pipeline.jobs.launch", "--exec", "--"]
    on_node = ["--on-node", "--report-dir", str(report), "--tiny-config", str(tiny), "--lora-config", str(lora)]
    argv = {
        "node": [
            "srun",
            "--nodes=1",
            "--ntasks=1",
            "--nodelist=trn2-st-1-1",
            *container,
            "python3",
            "-m",
            "llm_pipeline.trn2_acceptance",
            *on_node,
        ],
        "collectives-2-nodes": [*pair, *container, *launch, "-m", "llm_pipeline.trn2_acceptance", "--rank-probe"],
        "two-node": [*pair, *container, *launch, "-m", "llm_pipeline.train", "--config", str(report / "two-node.toml")],
    }
    trn2 = INSTANCE_TYPES["ml.trn2.48xlarge"]
    one_node = {
        "HPL_PARTITION": "trn2",
        "HPL_ACCELERATOR": "neuron",
        "HPL_DEVICES_PER_NODE": "64",
        "HPL_EFA_INTERFACES": "16",
        "HPL_EFA_DEVICE_RDMA": "1",
        "HPL_IMAGE_FAMILY": TORCHNEURON,
        "HPL_PEAK_TFLOPS": str(trn2.peak_tflops_per_device),
        "HPL_HOST_MEMORY_GIB": "2048",
        "HPL_IMAGE_URI": images[TORCHNEURON],
        "HPL_RUNTIME": "pyxis",
        "HPL_PAYLOADS_DIR": str(tmp_path),
        "PYTHONPATH": str(tmp_path),
        "TORCH_NEURONX_NEFF_CACHE_DIR": "/fsx/neuron-cache/torchneuron",
        "MALLOC_ARENA_MAX": "64",
    }
    efa = {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", "FI_EFA_USE_DEVICE_RDMA": "1"}
    two_nodes = {**one_node, **efa, "HPL_MASTER_PORT": str(20000 + (4242 + 2) % 12000)}
    table = {"node": one_node, "collectives-2-nodes": two_nodes, "two-node": two_nodes}
    assert [level.name for level in levels] == list(table)
    for level in levels:
        assert level.argv == argv[level.name], level.name
        assert level.env == table[level.name], level.name
    # In the image, the one-node levels run torchrun on this node with the partition's 64 ranks.
    one = acceptance_launch.torchrun(salloc, tmp_path, python="python3")
    assert one == [
        "python3",
        "-m",
        "torch.distributed.run",
        "--max_restarts=0",
        "--standalone",
        "--nnodes=1",
        "--nproc_per_node=64",
    ]
    single = {**salloc, "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1"}
    with pytest.raises(LaunchError, match=r"needs a 2-node Slurm allocation \(salloc -p trn2 -N 2"):
        acceptance_launch.level_commands(single, tmp_path, report=report, tiny_config=tiny, lora_config=lora)
    with pytest.raises(LaunchError, match="HPL_IMAGES_DIR not set: run on a cluster node"):
        acceptance_launch.level_commands(
            {**salloc, "HPL_IMAGES_DIR": ""}, tmp_path, report=report, tiny_config=tiny, lora_config=lora
        )
    with pytest.raises(LaunchError, match="SLURM_JOB_PARTITION='trn1-typo' is not a deployed partition"):
        acceptance_launch.torchrun({**salloc, "SLURM_JOB_PARTITION": "trn1-typo"}, tmp_path)
