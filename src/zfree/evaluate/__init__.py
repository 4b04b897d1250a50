"""The evaluate layer: one evaluation path of a CVAE on the validation rows and the latent statistics it reports."""
