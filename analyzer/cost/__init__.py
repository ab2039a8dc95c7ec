"""cost stage."""
