"""`hpctl plans --find`: SageMaker's answer comes from botocore's Stubber, which checks the request against botocore's
sagemaker model (enums, bounds) before it answers and the answer against the model's output shape (moto has no
SearchTrainingPlanOfferings)."""

from datetime import datetime, timezone

import boto3
import pytest
from botocore.stub import Stubber

from hpctl.nodes import plans
from tests.hpctl.conftest import REGION


@pytest.fixture
def stub(aws_env, project, monkeypatch):
    client = boto3.Session(region_name=REGION).client("sagemaker")
    monkeypatch.setattr(boto3.session.Session, "client", lambda self, service, *a, **k: client)
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def offering(ident, start, fee, *, zone="us-west-2d", hours=48, minutes=0, count=4, kind="ml.p5.48xlarge"):
    capacity = {
        "ReservedCapacityType": "Instance",
        "InstanceType": kind,
        "InstanceCount": count,
        "AvailabilityZone": zone,
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "StartTime": start,
        "EndTime": start.replace(day=start.day + 2),
    }
    return {
        "TrainingPlanOfferingId": ident,
        "TargetResources": ["hyperpod-cluster"],
        "DurationHours": hours,
        "DurationMinutes": minutes,
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
        "ReservedCapacityOfferings": [capacity],
    }


REQUEST = {
    "InstanceType": "ml.p5.48xlarge",
    "InstanceCount": 4,
    "DurationHours": 48,
    "TargetResources": ["hyperpod-cluster"],
}
MAY_3, MAY_1 = datetime(2026, 5, 3, 9, tzinfo=timezone.utc), datetime(2026, 5, 1, 12, tzinfo=timezone.utc)


def test_offerings_are_listed_earliest_start_first_then_cheapest_with_fee_duration_and_zone(stub, hpctl):
    answer = [
        offering("tpo-late", MAY_3, "9000.00"),
        offering("tpo-dear", MAY_1, "12000.00", zone="us-west-2a"),
        offering("tpo-cheap", MAY_1, "11520.00", minutes=30),
    ]
    stub.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": answer}, REQUEST)
    code, out, err = hpctl("plans", "--find", "ml.p5.48xlarge", "4", "--hours", "48")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(f"training-plan offerings for 4 x ml.p5.48xlarge for 48 hours in {REGION}")
    assert lines[1].split() == [
        "OFFERING", "START", "DURATION", "UPFRONT", "FEE", "PER", "NODE-HOUR", "ZONE", "CAPACITY"
    ]  # fmt: skip
    assert [line.split()[0] for line in lines[2:5]] == ["tpo-cheap", "tpo-dear", "tpo-late"]
    assert lines[2].split() == [
        "tpo-cheap", "2026-05-01", "12:00", "UTC", "48h", "30m", "11520.00", "USD", "59.38", "USD", "us-west-2d",
        "4", "x", "ml.p5.48xlarge",
    ]  # fmt: skip
    assert "62.50 USD" in lines[3] and "us-west-2a" in lines[3] and "46.88 USD" in lines[4]
    assert "aws sagemaker create-training-plan --training-plan-offering-id OFFERING" in lines[5]


def test_no_offering_is_one_line(stub, hpctl):
    stub.add_response("search_training_plan_offerings", {"TrainingPlanOfferings": []}, {**REQUEST, "InstanceCount": 64})
    code, out, _ = hpctl("plans", "--find", "ml.p5.48xlarge", "64", "--hours", "48")
    assert code == 0
    assert out == f"no training-plan offering for 64 x ml.p5.48xlarge for 48 hours in {REGION}: try fewer nodes, " \
        "fewer hours or another region\n"  # fmt: skip


def test_an_aws_refusal_is_one_line_naming_the_search(stub, hpctl):
    stub.add_client_error(
        "search_training_plan_offerings", "AccessDeniedException", "no sagemaker:SearchTrainingPlanOfferings", 400
    )
    code, out, err = hpctl("plans", "--find", "ml.trn1.32xlarge", "2", "--hours", "24")
    assert (code, out) == (2, "")
    assert err == (
        "error: not allowed to search training-plan offerings for 2 x ml.trn1.32xlarge: "
        "no sagemaker:SearchTrainingPlanOfferings\n"
    )


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["ml.g5.12xlarge", "2", "--hours", "24"], ["training plans do not reserve ml.g5.12xlarge", "ml.p5.48xlarge"]),
        (["ml.p5.96xlarge", "2", "--hours", "24"], ["ml.p5.96xlarge has no row in the accelerator table"]),
        (["ml.p6e-gb200.36xlarge", "2", "--hours", "24"], ["ml.p6e-gb200.36xlarge has no row"]),
        (["ml.p5.48xlarge", "0", "--hours", "24"], ["--find COUNT: 0 is out of range: 1 to 256 (", "InstanceCount"]),
        (["ml.p5.48xlarge", "257", "--hours", "24"], ["--find COUNT: 257 is out of range: 1 to 256"]),
        (["ml.p5.48xlarge", "two", "--hours", "24"], ["--find COUNT: a whole number of nodes, not 'two'"]),
        (["ml.p5.48xlarge", "2", "--hours", "0"], ["--hours: 0 is out of range: 1 to 87600 (", "DurationHours"]),
    ],
)
def test_a_request_the_model_refuses_is_refused_before_any_call(stub, hpctl, argv, words):
    """No response is stubbed: a call would fail the test with the Stubber's own error, not this line."""
    code, out, err = hpctl("plans", "--find", *argv)
    assert (code, out) == (2, "")
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for word in words:
        assert word in err, err


def test_a_botocore_without_the_hyperpod_target_is_named(monkeypatch):
    monkeypatch.setattr(plans, "TARGET", "hyperpod-clusters")
    with pytest.raises(plans.HpctlError, match=r"knows no target hyperpod-clusters .*update botocore"):
        plans.search_request("ml.p5.48xlarge", 1, 24)
