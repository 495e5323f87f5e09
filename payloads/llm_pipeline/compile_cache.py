"""Write the Neuron compile cache back to S3, so the next training job of the stack starts from it.

A training job's compile cache (HPL_COMPILE_CACHE_DIR, neuronx-cc's --cache_dir) lies on the job's
own volume and is gone when the job ends. hpctl names the stack's prefix, s3://<bucket>/neuron-cache/,
in HPL_COMPILE_CACHE_URI and passes it in as the `neuron_cache` channel, which the job copies into
the cache before precompile (jobs/sagemaker_env.restore_compile_cache); after precompile and train
the first host uploads the files the prefix does not hold yet. Cache entries are keyed by the
graph's hash, so an entry's files never change once written and every host compiles the same ones.

    python -m llm_pipeline.compile_cache --cache-dir DIR --uri s3://bucket/neuron-cache/
"""

from __future__ import annotations

import argparse
from pathlib import Path

SKIPPED_SUFFIXES = (".lock",)  # a compile in progress holds these; they are not part of an entry


def split_uri(uri: str) -> tuple[str, str]:
    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not uri.startswith("s3://") or not bucket or not prefix.strip("/"):
        raise ValueError(f"HPL_COMPILE_CACHE_URI={uri!r} is not s3://<bucket>/<prefix>/")
    return bucket, prefix.rstrip("/") + "/"


def persist(cache_dir: Path, uri: str, *, s3=None) -> int:
    """Upload the cache's files that are not under ``uri`` yet; returns how many were uploaded."""
    bucket, prefix = split_uri(uri)
    if s3 is None:
        import boto3  # only inside a training job; the job role may write this prefix (stacks/jobs.py)

        s3 = boto3.client("s3")
    held = set()
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        held.update(item["Key"] for item in page.get("Contents", []))
    uploaded = 0
    for path in sorted(cache_dir.rglob("*")):
        key = prefix + path.relative_to(cache_dir).as_posix()
        if path.is_file() and not path.name.endswith(SKIPPED_SUFFIXES) and key not in held:
            s3.upload_file(str(path), bucket, key)
            uploaded += 1
    print(f"compile cache: {uploaded} new file(s) from {cache_dir} to {uri} ({len(held)} were there)", flush=True)
    return uploaded


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache-dir", type=Path, required=True, help="the local compile cache (HPL_COMPILE_CACHE_DIR)")
    parser.add_argument("--uri", required=True, help="s3://<bucket>/<prefix>/ the stack's jobs share")
    args = parser.parse_args(argv)
    if not args.cache_dir.is_dir():
        print(f"compile cache: {args.cache_dir} does not exist, nothing to persist", flush=True)
        return 0
    persist(args.cache_dir, args.uri)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
