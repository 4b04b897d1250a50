"""zfree: keep the latent of a warm-started conditional VAE from collapsing, and measure it.

See DESIGN.md of the project for the math (section 1) and the artifact contract (section 5).
"""

__version__ = "0.1.0"
