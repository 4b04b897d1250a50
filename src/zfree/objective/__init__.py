"""The objective layer: the pure terms, the objective J of every latent kind and phase, and the analytic theory."""
