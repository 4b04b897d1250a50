"""The reference layer: z-free surprisal of any causal LM (scoring) and the base model's reference, c_base and its artifacts."""
