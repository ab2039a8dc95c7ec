"""replay stage."""
