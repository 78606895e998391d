"""reshard."""
