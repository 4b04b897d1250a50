"""The run application: one `zfree train` run (its folder, checkpoints, curves, evaluation and
metrics), the z-free synthetic base's training and the real model's fetch, built on the library
``zfree``'s primitives."""
