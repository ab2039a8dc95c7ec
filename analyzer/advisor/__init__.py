"""advisor stage."""
