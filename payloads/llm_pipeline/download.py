"""Download step: the model and tokenizer from the Hugging Face Hub into paths.model_dir, in model.dtype.

Only safetensors weights, config and tokenizer files are fetched (no full model load, no fp32 copy).
Shards that the Hub holds in another dtype are converted one at a time. A folder that is already
complete is left alone, so a rerun is free. A gated model without a token, a token without access,
or an unknown model id stops with a message saying what to do, and a non-zero exit.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from llm_pipeline import cli, hub_token
from llm_pipeline.config import RunConfig
from llm_pipeline.errors import StepError
from llm_pipeline.weights import model_files

ALLOW_PATTERNS = ["*.safetensors", "*.json", "tokenizer.model"]
IGNORE_PATTERNS = ["original/*"]  # Meta's consolidated .pth checkpoint and its files
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")


def find_token(env: Mapping[str, str] | None = None) -> str | None:
    """The Hub token: HF_TOKEN (or its old name), else the stack's secret (HPL_HF_TOKEN_SECRET_ARN, read now,
    kept in this process), else the file `huggingface-cli login` wrote."""
    env = os.environ if env is None else env
    for name in TOKEN_VARIABLES:
        if env.get(name, "").strip():
            return env[name].strip()
    arn = hub_token.secret_arn(env)
    if arn:
        token = hub_token.read_token(arn)
        if token:
            return token
    token_path = env.get("HF_TOKEN_PATH") or str(
        Path(env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface") / "token"
    )
    path = Path(token_path).expanduser()
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    return None


def check_access(model_id: str, gated: object, token: str | None) -> None:
    """A gated model needs a token; say so before any download starts."""
    if gated and not token:
        raise StepError(
            f"{model_id} is a gated model and no Hugging Face token was found: accept its license on "
            f"https://huggingface.co/{model_id}, then {hub_token.SET_HINT} (or set HF_TOKEN here)"
        )


def explain(exc: Exception, model_id: str, revision: str, token: str | None) -> StepError:
    """Turn a Hub error into a message naming the model and the fix."""
    import requests
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

    if isinstance(exc, GatedRepoError):
        return StepError(
            f"no access to the gated model {model_id} with this token: accept its license on https://huggingface.co/{model_id}"
        )
    if isinstance(exc, RevisionNotFoundError):
        return StepError(f"{model_id} has no revision {revision!r} (model.revision)")
    if isinstance(exc, RepositoryNotFoundError):
        hint = "check model.id" if token else "check model.id, or set HF_TOKEN if it is private"
        return StepError(f"model {model_id} not found or not accessible (HTTP 401/404): {hint}")
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, HfHubHTTPError) and status == 401:
        return StepError(f"the Hub rejected the Hugging Face token (HTTP 401) for {model_id}: check HF_TOKEN")
    if isinstance(exc, HfHubHTTPError):
        return StepError(f"the Hub refused {model_id}: {str(exc).splitlines()[0]}")
    if isinstance(exc, requests.RequestException):
        return StepError(f"cannot reach the Hugging Face Hub for {model_id}: {exc}")
    return StepError(f"the download of {model_id} failed: {exc}")


def fetch(model_id: str, revision: str, folder: Path, token: str | None, endpoint: str | None = None) -> None:
    """Check access, then fetch the safetensors, config and tokenizer files into `folder`."""
    import requests
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import HfHubHTTPError

    endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None  # read now, not at import (mirrors, tests)
    try:
        info = HfApi(endpoint=endpoint).model_info(model_id, revision=revision, token=token)
        check_access(model_id, info.gated, token)
        names = [sibling.rfilename for sibling in info.siblings or []]
        if not any(name.endswith(".safetensors") for name in names):
            raise StepError(f"{model_id} has no safetensors weights on the Hub; only safetensors models are supported")
        print(f"downloading {model_id}@{revision} into {folder}", flush=True)
        snapshot_download(
            model_id,
            revision=revision,
            local_dir=folder,
            allow_patterns=ALLOW_PATTERNS,
            ignore_patterns=IGNORE_PATTERNS,
            token=token,
            endpoint=endpoint,
        )
    except (HfHubHTTPError, requests.RequestException, OSError) as exc:
        raise explain(exc, model_id, revision, token) from None


def download(cfg: RunConfig, endpoint: str | None = None) -> Path:
    folder = Path(cfg.paths.model_dir)
    dtype = cfg.model.dtype
    if cfg.train.init_from:  # another run's merged model: read as it is, never written here
        missing = model_files.missing_parts(folder) if folder.is_dir() else ["the folder"]
        if missing:
            raise StepError(
                f"train.init_from: {folder} lacks {', '.join(missing)}: that run's merge step writes it; submit "
                "that run (or its merge) first"
            )
        print(f"{folder} is train.init_from's merged model; nothing to download", flush=True)
        return folder
    if model_files.is_complete(folder, dtype):
        model_files.share(folder)  # what this user put there (a download stand-in) for the cluster's other users
        print(f"{folder} already holds {cfg.model.id} in {dtype}; nothing to download", flush=True)
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    fetch(cfg.model.id, cfg.model.revision, folder, find_token(), endpoint)
    converted = model_files.convert_dtype(folder, dtype)
    missing = model_files.missing_parts(folder)
    if missing:
        raise StepError(f"the download of {cfg.model.id} into {folder} is incomplete, missing: {', '.join(missing)}")
    model_files.share(folder)
    print(f"model ready in {folder} ({dtype}; {converted} shard(s) converted)", flush=True)
    return folder


def main(argv=None) -> int:
    description = "Download the model and tokenizer from the Hugging Face Hub in model.dtype."
    return cli.run_config_only_step("download", description, download, argv)


if __name__ == "__main__":
    raise SystemExit(main())
