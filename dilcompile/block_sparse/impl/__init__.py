"""Block-sparse backends. They never import each other."""
