"""Pieces of one GRPO step that need more than one component; `train.py` strings them together."""
