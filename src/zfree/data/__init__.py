"""Data: the synthetic strategy benchmark, JSONL pairs with labels, and batching."""
