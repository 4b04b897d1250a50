"""The train layer: the CVAE training loop, its symmetry-breaking aids, the run folder, and base-model training."""
