"""Room `jobs`: the pipeline as a SageMaker training job (submit, status, logs, stop), no cluster needed."""
