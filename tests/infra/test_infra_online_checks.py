"""predeploy's online checks, with AWS played by botocore Stubbers (moto has no Service Quotas or training plans)."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from stacks.config import HyperPodConfig
from stacks.online_checks import online_refusals

pytestmark = pytest.mark.xdist_group("infra")
PLAN_ARN = "arn:aws:sagemaker:us-west-2:123456789012:training-plan/g5-reserved"
ZONES = {"AvailabilityZones": [{"ZoneName": f"us-west-2{c}", "ZoneId": f"usw2-az{n}"} for n, c in enumerate("abcd", 1)]}


def config(groups: list[dict], **context) -> HyperPodConfig:
    return HyperPodConfig.from_context({"compute_groups": json.dumps(groups), **context}, environ={})


def plan(
    *,
    instance_type="ml.g5.12xlarge",
    count=2,
    zone="usw2-az4",
    status="Active",
    targets=("hyperpod-cluster",),
    in_use=0,
):
    capacity = {
        "ReservedCapacityArn": "arn:aws:sagemaker:us-west-2:123456789012:reserved-capacity/rc-1",
        "InstanceType": instance_type,
        "TotalInstanceCount": count,
        "Status": "Active",
        "AvailabilityZone": "us-west-2d",
        "AvailabilityZoneId": zone,
    }
    return {
        "TrainingPlanArn": PLAN_ARN,
        "TrainingPlanName": "g5-reserved",
        "Status": status,
        "TotalInstanceCount": count,
        "AvailableInstanceCount": count - in_use,
        "InUseInstanceCount": in_use,
        "TargetResources": list(targets),
        "ReservedCapacitySummaries": [capacity],
    }


def quotas(**values: float) -> dict:
    return {
        "Quotas": [
            {"ServiceCode": "sagemaker", "QuotaName": f"{name} for cluster usage", "QuotaCode": f"L-{i}", "Value": v}
            for i, (name, v) in enumerate(values.items())
        ]
        + [{"ServiceCode": "sagemaker", "QuotaName": "ml.p5.48xlarge for training job usage", "Value": 0.0}]
    }


def offerings(**zones_by_type: list[str]) -> dict:
    """EC2's answer: each EC2 type (its name with _ for .) in the zone IDs given."""
    return {
        "InstanceTypeOfferings": [
            {"InstanceType": name.replace("_", "."), "LocationType": "availability-zone-id", "Location": zone}
            for name, zones in zones_by_type.items()
            for zone in zones
        ]
    }


def offer(session, answer: dict, *ec2_types: str) -> None:
    session.stub("ec2").add_response(
        "describe_instance_type_offerings",
        answer,
        {"LocationType": "availability-zone-id", "Filters": [{"Name": "instance-type", "Values": list(ec2_types)}]},
    )


def answer(session, *, zones=ZONES, offered=None, training_plan=None, quota_page=None):
    session.stub("ec2").add_response("describe_availability_zones", zones, {"AllAvailabilityZones": True})
    if offered is not None:
        offer(session, offered, *sorted({o["InstanceType"] for o in offered["InstanceTypeOfferings"]}))
    if training_plan is not None:
        session.stub("sagemaker").add_response(
            "describe_training_plan", training_plan, {"TrainingPlanName": "g5-reserved"}
        )
    session.stub("service-quotas").add_response(
        "list_service_quotas", quota_page or quotas(), {"ServiceCode": "sagemaker"}
    )
    return session


GPU_ON_PLAN = {
    "name": "gpu",
    "instance_type": "ml.g5.12xlarge",
    "partition": "g5",
    "count": 2,
    "training_plan_arn": PLAN_ARN,
}
TRN = {"name": "trn", "instance_type": "ml.trn1.32xlarge", "partition": "trn1", "count": 4}
TRN_HERE = offerings(trn1_32xlarge=["usw2-az4", "usw2-az1"])


def test_a_config_that_fits_passes(stubbed_session):
    session = answer(
        stubbed_session(),
        offered=TRN_HERE,
        training_plan=plan(),
        quota_page=quotas(**{"ml.trn1.32xlarge": 4, "ml.c5.xlarge": 10}),
    )
    assert online_refusals(config([TRN, GPU_ON_PLAN]), session) == []
    session.verify()


def test_a_training_plan_in_another_zone_is_refused_naming_the_group_and_key(stubbed_session):
    session = answer(stubbed_session(), training_plan=plan(zone="usw2-az1"))
    (problem,) = online_refusals(config([GPU_ON_PLAN]), session)
    assert problem.startswith(
        "config key 'compute_groups' group [0] (gpu), key 'training_plan_arn': plan g5-reserved: its capacity is in "
        "zone usw2-az1, not the stack's availability_zone_id usw2-az4"
    )


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"instance_type": "ml.p5.48xlarge"}, "it reserves ml.p5.48xlarge, not ml.g5.12xlarge"),
        ({"count": 1}, "it reserves 1 x ml.g5.12xlarge, fewer than count 2"),
        ({"status": "Expired"}, "it is Expired"),
        ({"status": "Pending"}, "it is Pending (not yet confirmed"),
        ({"count": 4, "in_use": 3}, "only 1 of its 4 instances are free (3 in use elsewhere), fewer than count 2"),
        ({"targets": ("training-job",)}, "it serves training-job, not HyperPod"),
    ],
)
def test_a_training_plan_that_does_not_fit_the_group_is_refused(stubbed_session, changes, words):
    session = answer(stubbed_session(), training_plan=plan(**changes))
    (problem,) = online_refusals(config([GPU_ON_PLAN]), session)
    assert words in problem


def test_a_missing_plan_is_named(stubbed_session):
    session = stubbed_session()
    session.stub("ec2").add_response("describe_availability_zones", ZONES, {"AllAvailabilityZones": True})
    session.stub("sagemaker").add_client_error(
        "describe_training_plan", service_error_code="ResourceNotFound", service_message="not found"
    )
    session.stub("service-quotas").add_response("list_service_quotas", quotas(), {"ServiceCode": "sagemaker"})
    (problem,) = online_refusals(config([GPU_ON_PLAN]), session)
    assert problem.endswith(f"no training plan {PLAN_ARN} in this account and region")


def test_a_zone_id_the_region_lacks_is_refused_with_its_ids(stubbed_session):
    session = answer(stubbed_session(), offered=offerings(trn1_32xlarge=["usw2-az9"]))
    (problem,) = online_refusals(config([TRN], availability_zone_id="usw2-az9"), session)
    assert problem == (
        "config key 'availability_zone_id' has value 'usw2-az9', which is not a zone of us-west-2 in this account; "
        "its zone IDs: usw2-az1, usw2-az2, usw2-az3, usw2-az4"
    )


def test_more_nodes_than_the_cluster_quota_are_refused(stubbed_session):
    """Every group of a type counts (the controller's type too); a quota for training jobs does not."""
    second = {**TRN, "name": "trn-b", "partition": "trn1b", "count": 3}
    session = answer(
        stubbed_session(), offered=TRN_HERE, quota_page=quotas(**{"ml.trn1.32xlarge": 6, "ml.c5.xlarge": 1})
    )
    (problem,) = online_refusals(config([TRN, second]), session)
    assert problem.startswith(
        "config key 'compute_groups': 7 x ml.trn1.32xlarge wanted, but this account's quota "
        "'ml.trn1.32xlarge for cluster usage' in us-west-2 is 6"
    )


def test_a_denied_check_is_skipped_with_a_note(stubbed_session, capsys):
    session = stubbed_session()
    session.stub("ec2").add_response("describe_availability_zones", ZONES, {"AllAvailabilityZones": True})
    offer(session, TRN_HERE, "trn1.32xlarge")
    session.stub("service-quotas").add_client_error("list_service_quotas", service_error_code="AccessDeniedException")
    assert online_refusals(config([TRN]), session) == []
    assert "note: predeploy could not check the service quotas" in capsys.readouterr().err


def test_other_errors_are_not_swallowed(stubbed_session):
    session = stubbed_session()
    session.stub("ec2").add_client_error("describe_availability_zones", service_error_code="InternalError")
    with pytest.raises(ClientError):
        online_refusals(config([TRN]), session)


def test_the_jobs_lane_has_nothing_to_check_online(stubbed_session):
    assert online_refusals(config([TRN], lanes="jobs"), stubbed_session()) == []


GPU = {"name": "gpu", "instance_type": "ml.p5.48xlarge", "partition": "p5", "count": 2}


def test_a_group_whose_type_the_zone_does_not_offer_is_refused_with_the_zones_that_do(stubbed_session):
    """trn1 and p5 in one zone: the zone has trn1, p5 lives elsewhere."""
    session = answer(
        stubbed_session(), offered=offerings(trn1_32xlarge=["usw2-az4"], p5_48xlarge=["usw2-az2", "usw2-az1"])
    )
    (problem,) = online_refusals(config([TRN, GPU]), session)
    assert problem.startswith(
        "config key 'compute_groups' group [1] (gpu): availability_zone_id usw2-az4 does not offer ml.p5.48xlarge; "
        "zones of us-west-2 that do: usw2-az1, usw2-az2 (set availability_zone_id"
    )
    session.verify()


def test_a_type_ec2_lists_nowhere_is_left_to_the_deploy_with_a_note(stubbed_session, capsys):
    session = stubbed_session()
    session.stub("ec2").add_response("describe_availability_zones", ZONES, {"AllAvailabilityZones": True})
    offer(session, offerings(trn1_32xlarge=["usw2-az4"]), "p5.48xlarge", "trn1.32xlarge")
    session.stub("service-quotas").add_response("list_service_quotas", quotas(), {"ServiceCode": "sagemaker"})
    assert online_refusals(config([TRN, GPU]), session) == []
    assert "note: predeploy could not check zone usw2-az4 for ml.p5.48xlarge: EC2 lists it in no zone" in (
        capsys.readouterr().err
    )


def test_groups_on_a_training_plan_are_judged_by_the_plan_not_the_offerings(stubbed_session):
    """No DescribeInstanceTypeOfferings call: the Stubber would fail on an unexpected request."""
    session = answer(stubbed_session(), training_plan=plan())
    assert online_refusals(config([GPU_ON_PLAN]), session) == []
    session.verify()
