"""A run's data file on its way to where the run reads it: the bucket's datasets/ prefix.

`hpctl submit` (the cluster) uploads a data.dataset that is a file on this machine with the run config, to
s3://<bucket>/datasets/<run>/<name>, which FSx imports as /fsx/datasets/<run>/<name>; the config it sends
reads it there. A data.dataset already under ${HPL_DATASETS_DIR} must be in the bucket; `hpctl submit` and
`hpctl job submit` refuse one that is not, with the command that uploads it (require_in_bucket).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import boto3

from cluster_contract import DATASETS_FOLDER, fsx_dir
from hpctl.common.errors import HpctlError, aws_errors

DATASETS_VARIABLE = "HPL_DATASETS_DIR"


@dataclass(frozen=True)
class LocalDataset:
    """A data.dataset file on this machine and where it goes."""

    local: Path
    key: str  # datasets/<run>/<name> in the bucket

    @property
    def cluster_path(self) -> str:
        return f"{fsx_dir(DATASETS_FOLDER)}/{PurePosixPath(self.key).relative_to(DATASETS_FOLDER)}"

    @property
    def config_value(self) -> str:
        """data.dataset in the config sent: the same place, as every node names it."""
        return f"${{{DATASETS_VARIABLE}}}/{PurePosixPath(self.key).relative_to(DATASETS_FOLDER)}"


def local_dataset(dataset: str, *, run: str) -> LocalDataset | None:
    """The data file ``dataset`` names on this machine: data.dataset as config.load gives it for the cluster (a
    local path absolute, a relative one resolved against the run config's folder); None for a Hub id or a path
    on the cluster."""
    if dataset.startswith(fsx_dir("")):
        return None
    path = Path(dataset).expanduser()
    if not path.is_absolute():
        return None  # a Hub dataset id: config.load made every local path absolute
    if path.is_dir():
        raise HpctlError(
            f"data.dataset {dataset} is a folder on this machine: upload it with `aws s3 sync {path} "
            f"s3://<bucket>/{DATASETS_FOLDER}/{run}/{path.name}/` and set data.dataset = "
            f'"${{{DATASETS_VARIABLE}}}/{run}/{path.name}"'
        )
    if path.is_file():
        return LocalDataset(local=path.resolve(), key=f"{DATASETS_FOLDER}/{run}/{path.name}")
    raise HpctlError(
        f"data.dataset {dataset} is neither a file here nor under {fsx_dir(DATASETS_FOLDER)}: name a file on "
        f'this machine (submit uploads it), or "${{{DATASETS_VARIABLE}}}/<name>" for one in the bucket'
    )


def cluster_dataset_key(dataset: str) -> str | None:
    """The bucket key of a data.dataset under the cluster's datasets folder, else None."""
    folder = fsx_dir(DATASETS_FOLDER) + "/"
    return f"{DATASETS_FOLDER}/{dataset[len(folder) :]}" if dataset.startswith(folder) else None


def require_in_bucket(session: boto3.Session, *, bucket: str, key: str, what: str) -> None:
    """Refuse a run whose input ``key`` is not in the bucket, with the command that puts it there."""
    with aws_errors(f"list s3://{bucket}/{key}"):
        found = session.client("s3").list_objects_v2(Bucket=bucket, Prefix=key, MaxKeys=1).get("KeyCount", 0)
    if not found:
        raise HpctlError(
            f"{what} is not in s3://{bucket}/{os.path.dirname(key)}/: upload it first "
            f"(aws s3 cp <file> s3://{bucket}/{key})"
        )


def upload_dataset(session: boto3.Session, *, bucket: str, dataset: LocalDataset) -> None:
    with aws_errors(f"upload {dataset.local} to s3://{bucket}/{dataset.key}"):
        session.client("s3").upload_file(str(dataset.local), bucket, dataset.key)
    print(f"data.dataset {dataset.local} -> s3://{bucket}/{dataset.key}", flush=True)
