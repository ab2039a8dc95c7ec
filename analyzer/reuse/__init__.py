"""reuse stage."""
