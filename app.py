#!/usr/bin/env python3
"""CDK entry point: `npx cdk synth|deploy|diff|destroy` runs this (see cdk.json).

Settings come from cdk.json context, overridable with `-c key=value` (see stacks/config.py).
cdk-nag's AwsSolutions checks run on every synth (stacks/nag.py): a finding fails it.
"""

import sys
from pathlib import Path

# This checkout's payload package, the one the stack uploads (stacks/payloads.py reads its deploy-facts
# contract), also when the CDK CLI is run directly rather than through make.
sys.path.insert(0, str(Path(__file__).resolve().parent / "payloads"))

from stacks.build import build_app
from stacks.validation import StackError


def main() -> int:
    try:
        app, _ = build_app()
    except StackError as error:  # a bad cdk.json value, a lifecycle folder, deploy facts: one root
        print(f"error: {error}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
