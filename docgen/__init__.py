"""The generated reference pages of the docs site (docs/reference/), made from the code.

`python -m docgen` rewrites them; tests/docs checks that they are up to date, so a
config key, a coordctl flag, an RPC method or a metric cannot exist without its entry.
Each page is a pure function of the imported code (no clock, no host): `PAGES` maps its
path, relative to the repository root, to the function that renders it.
"""
