"""Data: the synthetic strategy benchmark, JSONL pairs, the word-level tokenizer and batching."""
