"""Prompts with their tests: the problem record and its file formats, the bundled set, code extraction."""
