"""`hpctl status`: what the APIs report, in a table and as JSON."""

import json
import time

import boto3


def test_table_shows_stack_cluster_groups_nodes_fsx_and_image(deployed, hpctl):
    code, out, err = hpctl("status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == f"Stack        {deployed.stack}  CREATE_COMPLETE  ({deployed.region})"
    assert lines[1] == f"Cluster      {deployed.cluster}  InService  (id {deployed.cluster_id})"
    # moto's FSx reports no Lifecycle (the real API always does: AVAILABLE, CREATING, ...)
    assert lines[2].startswith(f"FSx          {deployed.fsx_id}  unknown, 1200 GiB  {deployed.fsx_id}.fsx.")
    assert lines[2].endswith("@tcp:/abcdefgh")
    assert lines[3] == "Image        123456789012.dkr.ecr.us-west-2.amazonaws.com/hpl-train:1"
    groups = out.split("Instance groups\n")[1].split("\n\n")[0].splitlines()
    assert groups[0].split() == [
        *("GROUP", "TYPE", "NODES", "(current/target)", "CAPACITY", "TRAINING", "PLAN", "AMI", "RELEASE")
    ]
    assert [line.split() for line in groups[1:]] == [
        ["controller", "ml.c5.xlarge", "1/1", "on-demand", "-", "-"],
        ["compute", "ml.trn1.32xlarge", "1/1", "on-demand", "-", "-"],
    ]
    nodes = out.split("Nodes\n")[1].splitlines()
    assert nodes[0].split() == ["GROUP", "INSTANCE", "TYPE", "STATUS", "LAUNCHED", "MESSAGE"]
    assert [line.split()[:4] for line in nodes[1:]] == [
        ["controller", "controller-0", "ml.c5.xlarge", "Running"],
        ["compute", "compute-0", "ml.trn1.32xlarge", "Running"],
    ]


def test_json_for_scripts(deployed, hpctl):
    code, out, _ = hpctl("status", "--json")
    report = json.loads(out)
    assert code == 0
    assert report["cluster"]["status"] == "InService"
    assert report["cluster"]["id"] == deployed.cluster_id
    assert report["stack"]["outputs"]["BucketName"] == deployed.bucket
    assert [(node["group"], node["status"]) for node in report["nodes"]] == [
        ("controller", "Running"),
        ("compute", "Running"),
    ]
    assert report["fsx"]["storage_gib"] == 1200 and report["fsx"]["mount_name"] == "abcdefgh"
    assert report["image_uri"].endswith("/hpl-train:1")


def test_failed_cluster_shows_the_reason(deployed, hpctl):
    deployed.set_cluster(status="Failed", failure="Lifecycle script on_create.sh failed on controller-0")
    code, out, _ = hpctl("status")
    assert code == 0  # status reports; the commands that need the cluster stop
    assert out.splitlines()[1:3] == [
        f"Cluster      {deployed.cluster}  Failed  (id {deployed.cluster_id})",
        "             reason: Lifecycle script on_create.sh failed on controller-0",
    ]


def test_no_nodes_yet(deployed, hpctl):
    deployed.remove_nodes()
    code, out, _ = hpctl("status")
    assert code == 0
    assert out.endswith("Nodes\n  none yet\n")


def test_file_system_gone(deployed, hpctl):
    boto3.client("fsx", region_name=deployed.region).delete_file_system(FileSystemId=deployed.fsx_id)
    _, out, _ = hpctl("status", "--json")
    assert json.loads(out)["fsx"]["status"] == "not found"


def test_cluster_deleted_behind_the_stack_s_back(deployed, hpctl):
    boto3.client("sagemaker", region_name=deployed.region).delete_cluster(ClusterName=deployed.cluster)
    code, _, err = hpctl("status")
    assert (code, err) == (
        2,
        f"error: cluster {deployed.cluster} named by the stack does not exist in us-west-2: "
        "was it deleted outside CloudFormation? `make deploy` recreates it\n",
    )


PLAN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/g5-reserved"


def test_each_group_shows_its_capacity_type_and_training_plan(deployed, hpctl):
    deployed.add_instance_group(
        InstanceGroupName="gpu",
        InstanceType="ml.p5.48xlarge",
        CurrentCount=2,
        TargetCount=4,
        CapacityRequirements={"Spot": {}},
    )
    deployed.add_instance_group(
        InstanceGroupName="reserved",
        InstanceType="ml.g5.12xlarge",
        CurrentCount=0,
        TargetCount=2,
        CapacityRequirements={"OnDemand": {}},
        TrainingPlanArn=PLAN,
        TrainingPlanStatus="Scheduled",
    )
    code, out, _ = hpctl("status")
    assert code == 0
    groups = out.split("Instance groups\n")[1].split("\n\n")[0].splitlines()
    assert [line.split() for line in groups[3:]] == [
        ["gpu", "ml.p5.48xlarge", "2/4", "spot", "-", "-"],
        ["reserved", "ml.g5.12xlarge", "0/2", "on-demand", "g5-reserved", "(Scheduled)", "-"],
    ]
    code, out, _ = hpctl("status", "--json")
    reported = {group["name"]: group for group in json.loads(out)["cluster"]["instance_groups"]}
    assert (reported["gpu"]["capacity"], reported["gpu"]["training_plan_arn"]) == ("spot", "")
    assert (reported["reserved"]["training_plan_arn"], reported["reserved"]["training_plan"]) == (
        PLAN,
        "g5-reserved (Scheduled)",
    )


def test_each_group_shows_its_ami_release_and_an_update_rolling_out(deployed, hpctl):
    for name, kind, current, desired, status in (
        ("gpu", "ml.p5.48xlarge", "2025.11.3", "2026.10.1", "SecurityUpdateRequired"),
        ("cpu", "ml.m5.xlarge", "2026.10.1", "2026.10.1", "UpToDate"),
    ):
        deployed.add_instance_group(
            InstanceGroupName=name,
            InstanceType=kind,
            CurrentCount=1,
            TargetCount=1,
            CurrentImageReleaseVersion=current,
            DesiredImageReleaseVersion=desired,
            ImageVersionStatus=status,
        )
    code, out, _ = hpctl("status")
    assert code == 0
    groups = out.split("Instance groups\n")[1].split("\n\n")[0].splitlines()
    assert [line.split()[5:] for line in groups[3:]] == [
        ["2025.11.3", "->", "2026.10.1", "(SecurityUpdateRequired)"],
        ["2026.10.1"],
    ]
    reported = {
        group["name"]: group for group in json.loads(hpctl("status", "--json")[1])["cluster"]["instance_groups"]
    }
    assert (reported["gpu"]["image_release"], reported["gpu"]["desired_image_release"]) == ("2025.11.3", "2026.10.1")


def test_slurm_version_queue_and_node_hours_saved_come_from_the_controller_when_asked(
    moto_server, session_tools, hpctl
):
    """The ledger of a scaled group: 2 nodes held for 3 h, then 0, first claim 10 h ago, ceiling 2."""
    hour, now = 3600, time.time()
    ledger = {"since": now - 10 * hour, "at": now - 7 * hour, "nodes": 0, "ceiling": 2, "node_seconds": 6 * hour}
    session_tools.replay_session(
        "hpl-job 11 trn1 RUNNING",
        "hpl-job 12 trn1 PENDING",
        "hpl-node compute-0 trn1 allocated",
        "hpl-version slurm 24.11.5",
        f"hpl-usage compute {json.dumps(ledger, separators=(',', ':'))}",
    )
    code, out, err = hpctl("status", "--slurm")
    assert code == 0, err
    lines = out.splitlines()
    assert not [line for line in lines if line.startswith("Capacity")]  # no claims file: nothing went wrong
    assert "Slurm        slurm 24.11.5, 1 job(s) running, 1 other(s) queued" in lines
    assert (
        "Saved        compute: 14.0 node-hours (6.0 held of 20.0 always-on, since its first claim; scale_with_runs)"
        in lines
    )
    assert "squeue" in " ".join(session_tools.calls())
    code, out, _ = hpctl("status")
    assert "Slurm " not in out  # no SSM session unless asked


def test_a_give_back_that_failed_is_named_by_status(moto_server, session_tools, hpctl):
    """The claims file of a group whose release hit AccessDenied and left a node it could not resume: both named."""
    claims = {
        "claims": {
            "live-1": {"nodes": 1, "jobs": ["7"], "since": 0, "released": False, "error": ""},
            "done-2": {"nodes": 2, "jobs": ["5"], "since": 0, "released": True, "error": "BatchDeleteClusterNodes for "
                       "group compute of cluster c failed: AccessDeniedException: not authorized"},
        },
        "problems": ["ip-10-1-0-3 left drained (its delete failed): Slurm refused to resume ip-10-1-0-3"],
    }  # fmt: skip
    session_tools.replay_session("hpl-version slurm 24.11.5", f"hpl-claims compute {json.dumps(claims, indent=1)}"
                                 .replace("\n", ""))  # fmt: skip
    code, out, err = hpctl("status", "--slurm")
    assert code == 0, err
    failed = [line for line in out.splitlines() if line.startswith("Capacity")]
    assert failed == [
        "Capacity     compute: claim done-2 (2 node(s)): BatchDeleteClusterNodes for group compute of cluster c "
        "failed: AccessDeniedException: not authorized",
        "Capacity     compute: ip-10-1-0-3 left drained (its delete failed): Slurm refused to resume ip-10-1-0-3",
    ]
