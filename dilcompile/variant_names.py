"""The names the factory's kinds and the profiler's variants share.

A factory kind's measured runs are the run store's rows whose ``variant`` is
the kind's name (or starts with ``<name>:``), written by the profiler variant
of that name; both registries spell these names from here, so they cannot
drift apart. A plain module with no imports: the factory loads with
``import dilcompile``, the profiler only when used.
"""

DILATED = "dilated"  # dilated attention, mode="longnet"
DILATED_GROUPS = "dilated-groups"  # dilated attention, mode="groups" (the seed library's head groups)
BLOCK_SPARSE = "block-sparse"  # block-sparse attention; profiler variants "block-sparse:<pattern spec>"
