"""One exception type for everything a user can fix, and the translation of AWS failures into it.

The CLI prints ``error: <message>`` and exits 2 for an HpctlError (1 for DeployFailed: the deploy or the
cluster failed); nothing else should reach the
user as a traceback when the cause is credentials, region, a missing stack or a cluster state.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    TokenRetrievalError,
)

EXPIRED_CODES = {"ExpiredToken", "ExpiredTokenException", "RequestExpired"}
REJECTED_CODES = {"InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "AuthFailure"}
DENIED_CODES = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


class HpctlError(Exception):
    """A problem the user can act on; the message says what happened and what to do."""

    exit_code = 2


class DeployFailed(HpctlError):
    """The last deploy (create or update) or the cluster failed: exit 1, so scripts can tell it from a usage error."""

    exit_code = 1


def no_credentials_message() -> str:
    return "no AWS credentials found: run `aws configure` (or `aws sso login`), or set AWS_PROFILE / AWS_ACCESS_KEY_ID"


def client_error_message(error: ClientError, *, doing: str) -> str:
    code = error.response.get("Error", {}).get("Code", "")
    text = error.response.get("Error", {}).get("Message", str(error))
    if code in EXPIRED_CODES:
        return f"AWS credentials have expired ({code}): refresh them (e.g. `aws sso login`) and retry"
    if code in REJECTED_CODES:
        return f"AWS rejected the credentials ({code}): check AWS_PROFILE or run `aws configure`"
    if code in DENIED_CODES:
        return f"not allowed to {doing}: {text}"
    return f"{doing} failed: {code}: {text}"


@contextlib.contextmanager
def aws_errors(doing: str) -> Iterator[None]:
    """Turn botocore failures met while ``doing`` something into an HpctlError."""
    try:
        yield
    except (NoCredentialsError, PartialCredentialsError) as error:
        raise HpctlError(no_credentials_message()) from error
    except TokenRetrievalError as error:
        raise HpctlError(f"AWS SSO token could not be refreshed: run `aws sso login` ({error})") from error
    except ProfileNotFound as error:
        raise HpctlError(f"{error}: check --profile / AWS_PROFILE against ~/.aws/config") from error
    except NoRegionError as error:
        raise HpctlError("no AWS region: pass --region, set `region` in cdk.json context, or set AWS_REGION") from error
    except EndpointConnectionError as error:
        raise HpctlError(
            f"cannot reach {error.kwargs.get('endpoint_url', 'the AWS endpoint')}: "
            "check the region name and your network"
        ) from error
    except ClientError as error:
        raise HpctlError(client_error_message(error, doing=doing)) from error
    except BotoCoreError as error:
        raise HpctlError(f"{doing} failed: {error}") from error
