"""`hpctl run compare` and `hpctl run tensorboard`: a run's events, evaluation and reports come down
from the S3 outputs prefix (moto plays S3), and only those; compare runs on the copies."""

from __future__ import annotations

import json

import boto3
import pytest


def events(folder, losses) -> bytes:
    """A TensorBoard event file as the trainers write one (train/loss per step, the batch shape)."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    writer.add_scalar("model/sequences_per_step", 4, 0)
    writer.add_scalar("model/sequence_length", 128, 0)
    for step, loss in enumerate(losses, 1):
        writer.add_scalar("train/loss", loss, step)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path.name, path.read_bytes()


@pytest.fixture
def runs(deployed, tmp_path):
    s3 = boto3.client("s3", region_name=deployed.region)
    losses = [2.0, 1.8, 1.6, 1.5]
    for run, scale in (("gpu", 1.0), ("trn", 1.002), ("lr-x3", 0.9)):
        name, body = events(tmp_path / "written" / run, [v * scale for v in losses])
        s3.put_object(Bucket=deployed.bucket, Key=f"outputs/{run}/tensorboard/{name}", Body=body)
        s3.put_object(Bucket=deployed.bucket, Key=f"outputs/{run}/logs/train-7.log", Body=b"step 1/4 | loss 2.0 |\n")
        s3.put_object(Bucket=deployed.bucket, Key=f"outputs/{run}/merged/model.safetensors", Body=b"weights")
    s3.put_object(Bucket=deployed.bucket, Key="outputs/trn/eval/eval.json", Body=json.dumps({
        "base": {"validation_loss": 2.5, "perplexity": 12.18}, "tuned": {"validation_loss": 1.5, "perplexity": 4.48},
    }).encode())  # fmt: skip
    return deployed


def test_compare_downloads_the_metrics_only_and_gives_the_verdict(runs, hpctl, tmp_path):
    out = tmp_path / "cmp"
    code, stdout, err = hpctl("run", "compare", "gpu", f"s3://{runs.bucket}/outputs/trn", "--output", str(out))
    assert (code, err) == (0, "")
    copies = sorted(str(p.relative_to(out / "runs")) for p in (out / "runs").rglob("*") if p.is_file())
    assert [c.split("/events.out")[0] for c in copies] == [
        "gpu/logs/train-7.log", "gpu/tensorboard", "trn/eval/eval.json", "trn/logs/train-7.log", "trn/tensorboard",
    ]  # fmt: skip
    assert "Verdict: **match**" in stdout and "| 2.5000 / 12.18 | 1.5000 / 4.48 |" in stdout
    assert (out / "compare.png").stat().st_size > 0
    code, stdout, _ = hpctl("run", "compare", "gpu", "lr-x3", "--output", str(tmp_path / "far"))
    assert code == 1 and "| lr-x3 |" in stdout and "**no**" in stdout


def test_tensorboard_brings_the_events_down_and_prints_how_to_open_them(runs, hpctl, tmp_path):
    code, stdout, _ = hpctl("run", "tensorboard", "trn", "--dest", str(tmp_path), "--print-only")
    assert code == 0
    assert f"run: tensorboard --logdir {tmp_path / 'trn' / 'tensorboard'} --port 6006" in stdout
    assert any((tmp_path / "trn" / "tensorboard").glob("events.out.tfevents.*"))


def test_a_run_that_is_not_there_is_named(runs, hpctl, tmp_path):
    code, _, err = hpctl("run", "tensorboard", "nope", "--dest", str(tmp_path))
    assert code == 2 and f"s3://{runs.bucket}/outputs/nope/ holds no run metrics" in err
