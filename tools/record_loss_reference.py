"""Write payloads/llm_pipeline/training/loss_reference.json: the CPU reference's loss curve (the tiny task,
llm_pipeline.training.tiny_task) for each step count a fleet level of the Trainium2 acceptance trains.

    .venv/bin/python -m tools.record_loss_reference
"""

from __future__ import annotations

import json
import sys

from llm_pipeline import trn2_acceptance
from llm_pipeline.training import fleet_reference, tiny_task

STEP_COUNTS = (trn2_acceptance.LORA_STEPS, trn2_acceptance.TWO_NODE_STEPS)


def curves() -> dict[str, list[float]]:
    return {str(steps): [round(x, 6) for x in tiny_task.train("cpu", steps=steps).losses] for steps in STEP_COUNTS}


def main() -> int:
    record = {"source": "tiny_task.train('cpu', steps=N), seed 0, fp32", "curves": curves()}
    fleet_reference.REFERENCE_FILE.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {fleet_reference.REFERENCE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
