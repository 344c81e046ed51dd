"""Glue to other libraries; each submodule imports its library only when used."""
