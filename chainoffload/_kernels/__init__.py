"""Jitted kernels. Private: they take arrays and trust them; the public wrappers validate."""
