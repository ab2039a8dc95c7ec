"""blocks stage."""
