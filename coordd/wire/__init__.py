"""The wire protocol's Structs (msgspec), one module per area; `protocol` registers every
method's params. Data only, no I/O. The bottom layer: imports nothing of coordd, nor any
client (the layers and wire-at-the-bottom contracts); everything may import it.
"""
