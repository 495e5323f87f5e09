"""The CDK app: config, one construct module per concern, and the stack that composes them."""
