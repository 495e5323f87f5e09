"""The Neuron compile cache across training jobs: one job writes its new entries to the stack's
prefix, the next gets them through the `neuron_cache` channel into HPL_COMPILE_CACHE_DIR.
moto stands in for S3; the copy in between is what SageMaker does for a File-mode channel."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws

from llm_pipeline import compile_cache, sagemaker_job
from llm_pipeline.jobs import sagemaker_env

BUCKET = "hpl-bucket"
URI = f"s3://{BUCKET}/neuron-cache/"
ENTRY = "neuronxcc-2.21.33363.0+82c7b2c2/MODULE_123+abc"  # neuronx-cc's layout: compiler version, graph hash


def compile_into(cache, name: str) -> None:
    entry = cache / ENTRY.replace("123", name)
    entry.mkdir(parents=True)
    (entry / "model.neff").write_bytes(b"neff " + name.encode())
    (entry / "model.hlo_module.pb").write_bytes(b"hlo")


def test_a_second_job_starts_from_the_first_jobs_compile_cache(tmp_path):
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-west-2")
        s3.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
        first = {
            "SM_MODEL_DIR": str(tmp_path / "job1" / "model"),
            "SM_HOSTS": '["algo-1"]',
            "SM_CURRENT_HOST": "algo-1",
        }
        cache = tmp_path / "job1" / "scratch" / "neuron-cache"
        assert sagemaker_env.pipeline_environment(first)["HPL_COMPILE_CACHE_DIR"] == str(cache)
        assert sagemaker_env.restore_compile_cache(first) == 0  # no channel: the stack's first job
        compile_into(cache, "1")
        (cache / ENTRY.replace("123", "1") / "model.lock").write_text("")  # a compile in progress
        assert compile_cache.persist(cache, URI, s3=s3) == 2
        keys = {item["Key"] for item in s3.list_objects_v2(Bucket=BUCKET, Prefix="neuron-cache/")["Contents"]}
        entry = f"neuron-cache/{ENTRY.replace('123', '1')}"
        assert keys == {f"{entry}/{name}" for name in ("model.neff", "model.hlo_module.pb")}

        root = tmp_path / "job2"  # SageMaker downloads the channel to <root>/input/data/neuron_cache
        for key in keys:
            target = root / "input" / "data" / "neuron_cache" / key.removeprefix("neuron-cache/")
            target.parent.mkdir(parents=True, exist_ok=True)
            s3.download_file(BUCKET, key, str(target))
        second = {"SM_MODEL_DIR": str(root / "model")}
        assert sagemaker_env.restore_compile_cache(second) == 2
        restored = root / "scratch" / "neuron-cache" / ENTRY.replace("123", "1") / "model.neff"
        assert restored.read_bytes() == b"neff 1"
        compile_into(root / "scratch" / "neuron-cache", "2")  # a graph the first job did not have
        assert compile_cache.persist(root / "scratch" / "neuron-cache", URI, s3=s3) == 2  # only the new entry


def test_a_failed_upload_leaves_the_job_running(tmp_path, capsys):
    env = {"HPL_COMPILE_CACHE_DIR": str(tmp_path), sagemaker_env.COMPILE_CACHE_URI_VARIABLE: "not-s3"}
    sagemaker_job.persist_compile_cache(env)
    printed = capsys.readouterr().out
    assert "compile cache not persisted (ValueError: HPL_COMPILE_CACHE_URI='not-s3' is not s3://" in printed


@pytest.mark.parametrize("uri", ["s3://bucket", "bucket/prefix/", "s3:///prefix"])
def test_the_cache_uri_must_name_a_bucket_and_prefix(uri):
    with pytest.raises(ValueError, match="HPL_COMPILE_CACHE_URI"):
        compile_cache.split_uri(uri)
