"""Examples that ship inside the package.

``mainspring.examples.migration`` is the staged migration that ``mainspring demo`` runs:
it lives here, not in the repository's ``examples/`` folder, so that the demo works from
an installed wheel as well as from a source checkout.
"""
