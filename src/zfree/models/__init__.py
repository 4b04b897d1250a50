"""Models: base-model loading and the latent-variable CVAEs."""
