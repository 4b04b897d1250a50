"""The evaluate layer: the readouts of z's use within one model, the latent statistics and the multi-reference metrics that a run's evaluation (``zfree_lab.run.metrics``) reports."""
