"""zfree: keep the latent of a warm-started conditional VAE from collapsing, and measure it.

The math, with its published sources: docs/concepts/ (problem, weightings, theory, controls, metrics,
readouts, aids); the files a run writes and their contract: docs/reference/artifacts.md.
"""

__version__ = "0.1.0"
