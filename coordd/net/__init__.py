"""net: TODO describe."""
